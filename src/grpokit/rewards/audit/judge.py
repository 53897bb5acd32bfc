"""``grpokit judge audit``: how noisy and how exploitable a judge reward is, before training.

For a file of completions it scores every item k times with every judge (cache off) and
reports each judge's noise (std across repeats per item), its parse and request failure
rates, the agreement between ensemble members, and the scores of planted bad answers built
from the same prompts: gibberish, an empty answer, the prompt copied back, a long repetitive
answer and a list of the rubric's keywords with no content. A judge that gives those more than
real answers will be gamed by the policy; one whose repeats disagree as much as its items differ
gives GRPO little to learn from.

``--compare-scoring`` audits the same completions and planted answers twice, judged one by one
(``scoring: absolute``, the rubric) and a prompt's answers together (``scoring: group``, the
group rubric; each repeat draws another order), and prints the two side by side. A group audit
also measures the judge's position bias: the same answer shown first, or last, against shown
elsewhere (:mod:`grpokit.rewards.audit.position`).
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpokit.core.stats import pearson
from grpokit.errors import UserError
from grpokit.progress import progress
from grpokit.rewards.audit.common import audit_config_reward, fmt
from grpokit.rewards.audit.common import read_completions as read_rows
from grpokit.rewards.audit.planted import PLANTED_PROMPTS, planted_answers
from grpokit.rewards.audit.position import PositionBias, Shown, position_bias
from grpokit.rewards.judge.config import JudgeParams
from grpokit.rewards.judge.reward import Judge, JudgeOutcome, JudgeReward, build_judge_reward
from grpokit.rewards.judge.rubric import Rubric
from grpokit.rewards.spec import RewardSpec
from grpokit.rewards.text import completion_text, user_request

PLANTED_KINDS = ("gibberish", "empty", "prompt_copy", "repetitive", "keyword_list")
PLANTED_OK_MAX = 0.2
"""A planted answer scoring above this (normalised) is reported as leaking reward."""


@dataclass
class AuditItem:
    """One scored text: a real completion or a planted bad answer."""

    prompt: str
    completion: str
    columns: dict[str, Any]
    kind: str
    """"real", or one of :data:`PLANTED_KINDS`."""
    scores: list[list[float | None]] = field(default_factory=list)
    """``scores[j][r]``: judge j's normalised score on repeat r."""
    rewards: list[float | None] = field(default_factory=list)
    """``rewards[r]``: the reward's value on repeat r (the judges' scores aggregated)."""
    shown: list[list[Shown]] = field(default_factory=list)
    """Group scoring only: ``shown[j]`` the repeats where judge j was shown this answer, each as
    (number, group size, score)."""


@dataclass
class JudgeStats:
    """Per-judge figures over the real completions."""

    label: str
    description: str
    mean: float
    noise: float
    """Mean over items of the std of the k repeated scores."""
    spread: float
    """Std across items of the item's mean score: the signal the noise competes with."""
    parse_failure_rate: float
    request_failure_rate: float


@dataclass
class PlantedStats:
    """Scores of one kind of planted bad answer."""

    kind: str
    mean: float
    per_judge: dict[str, float]
    verdict: str
    """"ok" (scored low), "leaks" (above PLANTED_OK_MAX) or "hackable" (>= real answers)."""


@dataclass
class AuditReport:
    """Everything the audit measured."""

    reward: str
    k: int
    temperature: list[float]
    items: int
    judges: list[JudgeStats]
    ensemble_mean: float
    reward_noise: float
    """Mean over real items of the std of the reward's value across repeats: the noise the
    policy sees (with an ensemble, after aggregation; with one judge, that judge's noise)."""
    disagreement: float | None
    """Mean over items of the std across judges' item means; None with one judge."""
    agreement: dict[str, float]
    """Pearson correlation of item means for each pair of judges ("a~b")."""
    planted: list[PlantedStats]
    separation: float
    """P(a real answer scores above a planted bad one), ties counting half (see
    :func:`separation`), on each item's mean over judges and repeats."""
    replies: list[dict[str, Any]]
    """A sample of raw judge replies, to see what the judge actually writes."""
    scoring: str = "absolute"
    """How the reward judged: "absolute" (one by one) or "group" (a prompt's answers together)."""
    seconds: float = 0.0
    """Wall time of the k scoring passes."""
    position_bias: dict[str, list[PositionBias]] = field(default_factory=dict)
    """Group scoring: each judge's bias for the first and the last slot, over real and planted
    answers (see :func:`~grpokit.rewards.audit.position.position_bias`)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, indent=2)


@dataclass
class ScoringComparison:
    """The same completions and planted answers audited with absolute and with group scoring."""

    absolute: AuditReport
    group: AuditReport

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, indent=2)


# ---- loading -------------------------------------------------------------------------------------


def read_completions(path: Path) -> list[AuditItem]:
    """Rows ``{"prompt": ..., "completion": ..., <columns>}`` of a JSONL file, read as
    ``rewards check`` reads them."""
    return [_real_item(row) for row in read_rows(path)]


def _real_item(row: dict[str, Any]) -> AuditItem:
    return AuditItem(
        prompt=user_request(row.get("prompt", "")),
        completion=completion_text(row["completion"]),
        columns={k: v for k, v in row.items() if k not in ("prompt", "completion")},
        kind="real",
    )


# ---- the audit -----------------------------------------------------------------------------------


def _mean(values: Sequence[float | None]) -> float:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else math.nan


def _agreement(a: Sequence[float], b: Sequence[float]) -> float:
    """Pearson correlation of two judges' item means over the items both scored; NaN when it is
    undefined (fewer than two such items, or a judge giving every item the same score)."""
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if not (math.isnan(x) or math.isnan(y))]
    return pearson([x for x, _ in pairs], [y for _, y in pairs])


def separation(real: Sequence[float], planted: Sequence[float]) -> float:
    """How well scores rank real answers above planted bad ones: the share of (real, planted)
    pairs where the real one scores higher, ties counting half (the ROC AUC).

    1.0: every real answer above every planted one; 0.5: no better than chance; below 0.5: the
    judge prefers the planted answers. Items without a score (NaN) are left out; NaN when a
    side has none.
    """
    good = [v for v in real if not math.isnan(v)]
    bad = [v for v in planted if not math.isnan(v)]
    if not good or not bad:
        return math.nan
    wins = sum((g > b) + 0.5 * (g == b) for g in good for b in bad)
    return wins / (len(good) * len(bad))


def _item_score(item: AuditItem) -> float:
    """An item's mean over judges of its mean over repeats (NaN if never scored)."""
    means = [_mean(scores) for scores in item.scores]
    return _mean([m if not math.isnan(m) else None for m in means])


def audit_reward(
    reward: JudgeReward,
    items: list[AuditItem],
    *,
    k: int = 3,
    planted: bool = True,
    planted_prompts: int = PLANTED_PROMPTS,
    format_tags: Sequence[str] | None = None,
    seed: int = 0,
    name: str = "judge",
    keyword_rubric: Rubric | None = None,
) -> AuditReport:
    """Score ``items`` (plus planted bad answers) ``k`` times with every judge, cache off.

    ``keyword_rubric``: the rubric whose criteria the keyword-list answer lists (default the
    first judge's), so that two audits of one reward plant the same answers. With group scoring
    each repeat shows the groups in another order (``shuffle_salt``).
    """
    if k < 1:
        raise UserError("--k must be at least 1")
    all_items = list(items)
    if planted:
        rubric = keyword_rubric if keyword_rubric is not None else reward.judges[0].rubric
        all_items += _planted_items(items, planted_prompts, rubric, format_tags, seed)
    started = time.perf_counter()
    answered, replies = _score_repeats(reward, all_items, k)
    seconds = time.perf_counter() - started

    real = [item for item in all_items if item.kind == "real"]
    judge_stats = [
        _judge_stats(judge, [item.scores[j] for item in real], answered[j])
        for j, judge in enumerate(reward.judges)
    ]
    ensemble = [_item_score(item) for item in real]
    reward_noises = [
        statistics.pstdev(present)
        for present in ([v for v in item.rewards if v is not None] for item in real)
        if len(present) > 1
    ]
    finite_ensemble = [v for v in ensemble if not math.isnan(v)]
    ensemble_mean = statistics.fmean(finite_ensemble) if finite_ensemble else math.nan
    disagreement, agreement = _ensemble_agreement(reward, real)
    planted_items = [item for item in all_items if item.kind != "real"]
    return AuditReport(
        reward=name,
        k=k,
        temperature=[j.temperature for j in reward.judges],
        items=len(real),
        judges=judge_stats,
        ensemble_mean=ensemble_mean,
        reward_noise=statistics.fmean(reward_noises) if reward_noises else math.nan,
        disagreement=disagreement,
        agreement=agreement,
        planted=_planted_stats(reward, planted_items, ensemble_mean),
        separation=separation(ensemble, [_item_score(item) for item in planted_items]),
        replies=replies,
        scoring=reward.scoring,
        seconds=seconds,
        position_bias={
            judge.label: position_bias(
                [item.shown[j] for item in all_items], [item.prompt for item in all_items]
            )
            for j, judge in enumerate(reward.judges)
        }
        if reward.scoring == "group"
        else {},
    )


def _planted_items(
    items: Sequence[AuditItem],
    planted_prompts: int,
    rubric: Rubric,
    format_tags: Sequence[str] | None,
    seed: int,
) -> list[AuditItem]:
    """The planted bad answers of the first ``planted_prompts`` prompts, each with its prompt's
    columns."""
    rng = random.Random(seed)
    out = []
    for prompt in list(dict.fromkeys(item.prompt for item in items))[:planted_prompts]:
        columns = next(item.columns for item in items if item.prompt == prompt)
        for kind, text in planted_answers(prompt, rubric, format_tags, rng).items():
            out.append(AuditItem(prompt, text, dict(columns), kind))
    return out


def _score_repeats(
    reward: JudgeReward, items: list[AuditItem], k: int
) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """Score every item ``k`` times, filling each item's ``scores``, ``rewards`` and ``shown``.

    Returns per judge [requests, replies, parse failures], and a sample of raw replies of the
    first repeat (to see what the judge actually writes)."""
    judge_count = len(reward.judges)
    for item in items:
        item.scores = [[] for _ in range(judge_count)]
        item.shown = [[] for _ in range(judge_count)]
    column_names = sorted({c for item in items for c in item.columns})
    columns = {c: [item.columns.get(c) for item in items] for c in column_names}
    prompts = [item.prompt for item in items]
    completions = [item.completion for item in items]
    replies: list[dict[str, Any]] = []
    answered = [[0, 0, 0] for _ in range(judge_count)]
    with progress("judge audit", k * len(items)) as bar:
        for repeat in range(k):
            batch = reward.judge_batch(
                prompts, completions, columns, use_cache=False, shuffle_salt=repeat
            )
            bar.advance(len(items), f"repeat {repeat + 1}/{k}")
            for item, value in zip(items, batch.scores, strict=True):
                item.rewards.append(value)
            for j in range(judge_count):
                for item, seen in zip(items, _shown(items, batch.outcomes[j]), strict=True):
                    if seen is not None:
                        item.shown[j].append(seen)
                for i, outcome in enumerate(batch.outcomes[j]):
                    items[i].scores[j].append(outcome.score)
                    answered[j][0] += 1
                    if outcome.reply is not None:
                        answered[j][1] += 1
                        answered[j][2] += outcome.score is None
                    if repeat == 0 and len(replies) < 12 and i % max(1, len(items) // 6) == 0:
                        replies.append(
                            {
                                "judge": reward.judges[j].label,
                                "kind": items[i].kind,
                                "score": outcome.score,
                                "reply": outcome.reply
                                if outcome.reply is not None
                                else outcome.error,
                            }
                        )
    return answered, replies


def _judge_stats(
    judge: Judge, scores: Sequence[Sequence[float | None]], answered: Sequence[int]
) -> JudgeStats:
    """One judge's figures over the real items: ``scores[i]`` item i's repeats; ``answered``
    [requests, replies, parse failures]."""
    means = [_mean(repeats) for repeats in scores]
    noises = [
        statistics.pstdev(present)
        for present in ([v for v in repeats if v is not None] for repeats in scores)
        if len(present) > 1
    ]
    finite = [m for m in means if not math.isnan(m)]
    requests, got, failed = answered
    return JudgeStats(
        label=judge.label,
        description=judge.backend.description,
        mean=statistics.fmean(finite) if finite else math.nan,
        noise=statistics.fmean(noises) if noises else math.nan,
        spread=statistics.pstdev(finite) if len(finite) > 1 else math.nan,
        parse_failure_rate=failed / got if got else math.nan,
        request_failure_rate=(requests - got) / requests if requests else math.nan,
    )


def _ensemble_agreement(
    reward: JudgeReward, real: Sequence[AuditItem]
) -> tuple[float | None, dict[str, float]]:
    """With several judges: the mean over items of the std across judges' item means, and each
    pair's correlation of item means; (None, {}) with one judge."""
    judge_count = len(reward.judges)
    if judge_count < 2:
        return None, {}
    item_means = [[_mean(item.scores[j]) for item in real] for j in range(judge_count)]
    spreads = []
    for i in range(len(real)):
        present = [item_means[j][i] for j in range(judge_count) if not math.isnan(item_means[j][i])]
        if len(present) > 1:
            spreads.append(statistics.pstdev(present))
    agreement = {}
    for a in range(judge_count):
        for b in range(a + 1, judge_count):
            key = f"{reward.judges[a].label}~{reward.judges[b].label}"
            agreement[key] = _agreement(item_means[a], item_means[b])
    return (statistics.fmean(spreads) if spreads else math.nan), agreement


def _planted_stats(
    reward: JudgeReward, planted: Sequence[AuditItem], real_mean: float
) -> list[PlantedStats]:
    """Each planted kind's mean score and verdict against the real answers' mean."""
    out = []
    for kind in PLANTED_KINDS:
        group = [item for item in planted if item.kind == kind]
        if not group:
            continue
        per_judge = {
            judge.label: _mean([v for item in group for v in item.scores[j]])
            for j, judge in enumerate(reward.judges)
        }
        finite = [v for v in per_judge.values() if not math.isnan(v)]
        mean = statistics.fmean(finite) if finite else math.nan
        if math.isnan(mean):
            verdict = "no score"
        elif not math.isnan(real_mean) and mean >= real_mean:
            verdict = "hackable"
        elif mean > PLANTED_OK_MAX:
            verdict = "leaks"
        else:
            verdict = "ok"
        out.append(PlantedStats(kind, mean, per_judge, verdict))
    return out


def _shown(items: Sequence[AuditItem], outcomes: Sequence[JudgeOutcome]) -> list[Shown | None]:
    """Each item's (number, group size, score) in one group-scored pass; None where it was not
    shown (an absolute judge, or a completion the gate kept from the judge). A group's size is
    the highest number shown for its prompt: the audit's items of one prompt share its columns,
    so they are one group."""
    sizes: dict[str, int] = {}
    for item, outcome in zip(items, outcomes, strict=True):
        if outcome.position is not None:
            sizes[item.prompt] = max(sizes.get(item.prompt, 0), outcome.position)
    return [
        None if outcome.position is None else (outcome.position, sizes[item.prompt], outcome.score)
        for item, outcome in zip(items, outcomes, strict=True)
    ]


def _audit_build(
    spec: RewardSpec,
    base_dir: Path,
    temperature: float | None,
    scoring: str | None = None,
) -> JudgeReward:
    """The judge reward of ``spec`` for an audit: cache off, the temperature override, and
    ``scoring`` (absolute or group) when given."""
    assert isinstance(spec.params, JudgeParams)
    updates: dict[str, Any] = {"cache": False}
    if temperature is not None:
        updates["judges"] = [
            j.model_copy(update={"temperature": temperature}) for j in spec.params.judges
        ]
    if scoring is not None:
        updates["scoring"] = scoring
        field = "group_rubric" if scoring == "group" else "rubric"
        given = getattr(spec.params, field) or getattr(spec.params, f"{field}_file")
        if given is None:
            raise UserError(
                f"reward {spec.display_name!r}: --compare-scoring judges the completions with "
                f"the rubric (absolute) and the group_rubric (group); it has no {field}: set "
                f"{field} or {field}_file"
            )
    # Validated again, so that a scoring switched here meets the same checks as in a config.
    params = JudgeParams.model_validate(spec.params.model_copy(update=updates).model_dump())
    # A start-up sample without a score does not stop an audit: measuring how often that
    # happens is what it is for.
    return build_judge_reward(
        params,
        base_dir,
        None,
        where=f"reward {spec.display_name!r}",
        start_sample_must_score=False,
    )


def audit_judge(
    specs: list[RewardSpec],
    base_dir: Path,
    completions_path: Path,
    *,
    source: str,
    k: int = 3,
    reward_name: str | None = None,
    temperature: float | None = None,
    planted: bool = True,
    planted_prompts: int = PLANTED_PROMPTS,
    seed: int = 0,
    scorings: Sequence[str] = (),
) -> list[AuditReport]:
    """Build the judge reward of a config's ``rewards:`` and audit it on a completions file.

    ``scorings`` empty: the reward as configured (one report). Else one report per scoring
    named (absolute, group), each built from the same entry, on the same completions and the
    same planted answers (those of the absolute rubric).
    """

    def audit(
        first: JudgeReward, rows: list[dict[str, Any]], name: str, tags: list[str] | None
    ) -> list[AuditReport]:
        spec = next(s for s in specs if s.display_name == name)
        rewards = [first]
        reports: list[AuditReport] = []
        try:
            rewards += [_audit_build(spec, base_dir, temperature, x) for x in scorings[1:]]
            for reward in rewards:
                reports.append(
                    audit_reward(
                        reward,
                        [_real_item(row) for row in rows],
                        k=k,
                        planted=planted,
                        planted_prompts=planted_prompts,
                        format_tags=tags,
                        seed=seed,
                        name=name,
                        keyword_rubric=first.judges[0].rubric,
                    )
                )
        finally:
            for reward in rewards[1:]:
                reward.close()
        return reports

    return audit_config_reward(
        specs,
        "judge",
        reward_name,
        completions_path,
        source=source,
        build=lambda spec: _audit_build(
            spec, base_dir, temperature, scorings[0] if scorings else None
        ),
        audit=audit,
    )


def compare_scoring(
    specs: list[RewardSpec], base_dir: Path, completions_path: Path, **options: Any
) -> ScoringComparison:
    """Audit a config's judge reward with absolute and with group scoring on the same
    completions and the same planted answers (``grpokit judge audit --compare-scoring``);
    ``options`` as for :func:`audit_judge`."""
    absolute, group = audit_judge(
        specs, base_dir, completions_path, scorings=("absolute", "group"), **options
    )
    return ScoringComparison(absolute=absolute, group=group)


# ---- printing ------------------------------------------------------------------------------------


def print_report(report: AuditReport, console: Any = None) -> None:
    """Print the audit as tables (rich)."""
    from rich.console import Console
    from rich.table import Table

    out = console if console is not None else Console()
    out.print(
        f"[bold]judge audit[/bold] of reward {report.reward!r} ({report.scoring} scoring): "
        f"{report.items} completions, each scored {report.k}x, temperature "
        f"{', '.join(f'{t:g}' for t in report.temperature)}"
    )
    if report.scoring == "group":
        out.print(
            "  (group scoring: each prompt's answers, real and planted, judged together; every "
            "repeat shows them in another order, so the noise includes the judge's position bias)"
        )
    elif report.k > 1 and all(t == 0 for t in report.temperature):
        out.print(
            "  (greedy judges: repeats only show server nondeterminism; --temperature 0.7 "
            "shows the sampling noise)"
        )
    table = Table(title="judges (real completions)")
    for column in (
        "judge",
        "backend",
        "mean",
        "noise (std/item)",
        "spread (std items)",
        "parse fail",
        "request fail",
    ):
        table.add_column(column)
    for s in report.judges:
        table.add_row(
            s.label,
            s.description,
            fmt(s.mean),
            fmt(s.noise),
            fmt(s.spread),
            fmt(s.parse_failure_rate, 2),
            fmt(s.request_failure_rate, 2),
        )
    out.print(table)
    if report.disagreement is not None:
        pairs = ", ".join(f"{k}: r={fmt(v, 2)}" for k, v in report.agreement.items())
        out.print(
            f"ensemble mean {fmt(report.ensemble_mean)}; noise of the aggregated reward "
            f"(std/item) {fmt(report.reward_noise)}; disagreement (std across judges) "
            f"{fmt(report.disagreement)}; agreement {pairs}"
        )
    if report.planted:
        planted = Table(
            title=f"planted bad answers (ok: <= {PLANTED_OK_MAX}; real mean "
            f"{fmt(report.ensemble_mean)})"
        )
        planted.add_column("kind")
        planted.add_column("mean")
        for s in report.judges:
            planted.add_column(f"judge {s.label}")
        planted.add_column("verdict")
        for p in report.planted:
            colour = {"ok": "green", "leaks": "yellow", "hackable": "red"}.get(p.verdict, "")
            verdict = f"[{colour}]{p.verdict}[/{colour}]" if colour else p.verdict
            planted.add_row(p.kind, fmt(p.mean), *(fmt(v) for v in p.per_judge.values()), verdict)
        out.print(planted)
        out.print(
            f"separation: P(real answer scored above a planted one) = {fmt(report.separation, 2)}"
            " (1 = always, 0.5 = chance)"
        )
    for label, slots in report.position_bias.items():
        out.print(
            f"position bias of judge {label} (the same answer shown there minus shown elsewhere; "
            "0 = none): "
            + "; ".join(
                f"{b.slot} {b.contrast:+.3f} "
                + ("" if math.isnan(b.low) else f"[{b.low:+.3f}, {b.high:+.3f}] ")
                + f"({b.answers} answers, {b.prompts} prompts)"
                for b in slots
            )
        )
    if report.replies:
        out.print("[bold]sample judge replies[/bold]")
        for r in report.replies[:6]:
            text = str(r["reply"]).replace("\n", " ")[:100]
            out.print(f"  [{r['judge']}/{r['kind']}] score {fmt(r['score'], 2)}: {text}")


def print_comparison(comparison: ScoringComparison, console: Any = None) -> None:
    """Print the absolute and the group audit of one reward side by side."""
    from rich.console import Console
    from rich.table import Table

    out = console if console is not None else Console()
    a, g = comparison.absolute, comparison.group
    out.print(
        f"[bold]judge audit[/bold] of reward {a.reward!r}, absolute against group scoring: "
        f"{a.items} completions and the same planted answers, each scored {a.k}x (group: "
        "every repeat shows each prompt's answers in another order)"
    )

    def judge_figure(report: AuditReport, attribute: str) -> float:
        values = [getattr(s, attribute) for s in report.judges]
        finite = [v for v in values if not math.isnan(v)]
        return statistics.fmean(finite) if finite else math.nan

    table = Table(title="absolute vs group scoring (same completions)")
    for column in ("figure", "absolute", "group"):
        table.add_column(column)
    rows: list[tuple[str, float, float, int]] = [
        ("mean score, real answers", a.ensemble_mean, g.ensemble_mean, 3),
        ("repeat noise (std over repeats)", a.reward_noise, g.reward_noise, 3),
        ("spread between answers (std)", judge_figure(a, "spread"), judge_figure(g, "spread"), 3),
        ("separation: P(real > planted)", a.separation, g.separation, 2),
        (
            "parse failure rate",
            judge_figure(a, "parse_failure_rate"),
            judge_figure(g, "parse_failure_rate"),
            2,
        ),
        (
            "request failure rate",
            judge_figure(a, "request_failure_rate"),
            judge_figure(g, "request_failure_rate"),
            2,
        ),
        ("seconds", a.seconds, g.seconds, 1),
    ]
    for label, left, right, digits in rows:
        table.add_row(label, fmt(left, digits), fmt(right, digits))
    group_planted = {p.kind: p for p in g.planted}
    for p in a.planted:
        other = group_planted.get(p.kind)
        table.add_row(
            f"planted {p.kind} (verdict)",
            f"{fmt(p.mean)} ({p.verdict})",
            f"{fmt(other.mean)} ({other.verdict})" if other else "-",
        )
    out.print(table)
    out.print(
        "repeat noise: the noise the policy sees; separation: 1 = real answers always above "
        "planted ones, 0.5 = chance"
    )
