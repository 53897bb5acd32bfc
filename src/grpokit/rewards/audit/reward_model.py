"""``grpokit judge audit-reward-model``: a reward model's biases, measured before training on it.

The questions the judge audit (:mod:`grpokit.rewards.audit.judge`) asks of a judge, asked of a
trained scorer, on a file of the user's own completions:

- planted bad answers built from the same prompts (the judge audit's gibberish, empty answer,
  prompt copied back and long repetition, plus a real answer cut in half and a real answer to
  another prompt): a policy finds whatever a reward model prefers, so any of these scoring like
  real answers will be exploited;
- repeat noise: every text is scored k times, each time in a different order (so in different
  batches, with different padding). A deterministic model gives 0, or differences at the level
  of floating-point rounding, and the report says so rather than presenting that as a measured
  noise level;
- the correlation of the score with the completion's length in the reward model's tokens,
  Pearson and Spearman: reward models trained on human preferences are known to favour long
  answers, and GRPO will lengthen completions to collect that.

Scores are the model's raw scores (``logits[:, label_index]``): the reward's normalisation is an
increasing affine map, so it changes neither ranks, verdicts nor correlations.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grpokit.core.stats import pearson, spearman
from grpokit.errors import UserError
from grpokit.progress import progress
from grpokit.rewards.audit.common import audit_config_reward, fmt
from grpokit.rewards.audit.planted import PLANTED_PROMPTS, planted_answers
from grpokit.rewards.builtin.reward_model import RewardModelParams, RewardModelReward
from grpokit.rewards.judge.rubric import Rubric
from grpokit.rewards.spec import RewardSpec
from grpokit.rewards.text import completion_text, user_request

PLANTED_KINDS = ("gibberish", "empty", "prompt_copy", "repetitive", "truncated", "off_topic")
"""The judge audit's kinds (less its rubric keyword list: a reward model has no rubric), plus
``truncated`` (the first half of a real answer) and ``off_topic`` (a real answer to another
prompt)."""
ROUNDING_ONLY = 1e-4
"""Repeats differing by less than this share of the spread across texts differ by rounding."""
LENGTH_BIAS_WARN = 0.3
"""An absolute Spearman correlation of score and length from which the report warns."""


@dataclass
class PlantedScore:
    """How one kind of planted bad answer scored against the real completions."""

    kind: str
    n: int
    mean: float
    beats: float
    """Share of real completions scoring below this kind's mean."""
    verdict: str
    """"ok" (below every real completion), "leaks" (above some) or "hackable" (at or above
    the real mean)."""


@dataclass
class LengthBias:
    """Correlation of score with completion length (tokens) over a set of samples."""

    samples: str
    """"real" (the file's completions) or "all" (with the planted answers)."""
    n: int
    pearson: float
    spearman: float


@dataclass
class RewardModelAudit:
    """Everything the reward-model audit measured."""

    reward: str
    model: str
    k: int
    items: int
    mean: float
    """Mean raw score of the real completions."""
    spread: float
    """Std across real completions of their mean score: the signal that noise competes with."""
    noise: float
    """Mean over items of the std of their k scores."""
    max_repeat_difference: float
    """Largest difference between two scores of the same text (0: a deterministic model)."""
    length: list[LengthBias]
    planted: list[PlantedScore]
    scores: list[dict[str, Any]]
    """Every scored text: kind, mean score, length in tokens."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, indent=2)


# ---- loading -------------------------------------------------------------------------------------


# ---- the audit -----------------------------------------------------------------------------------


@dataclass
class _Sample:
    prompt: Any
    completion: Any
    kind: str


def planted_samples(
    prompts: list[Any],
    answers: dict[str, str],
    tags: list[str] | None,
    *,
    seed: int = 0,
    planted_prompts: int = PLANTED_PROMPTS,
) -> list[_Sample]:
    """Bad answers for the first ``planted_prompts`` distinct prompts, one of each kind.

    ``answers`` maps a prompt's text to one real completion of it (for ``truncated`` and
    ``off_topic``; the latter needs a second prompt and is left out with only one).
    """
    rng = random.Random(seed)
    distinct = list({user_request(p): p for p in prompts}.items())
    no_rubric = Rubric(template="", source="reward model audit")
    samples: list[_Sample] = []
    for index, (text, prompt) in enumerate(distinct[:planted_prompts]):
        planted = planted_answers(text, no_rubric, tags, rng)
        real = answers[text]
        planted["truncated"] = real[: len(real) // 2]
        if len(distinct) > 1:
            other = distinct[(index + 1) % len(distinct)][0]
            planted["off_topic"] = answers[other]
        samples.extend(_Sample(prompt, planted[k], k) for k in PLANTED_KINDS if k in planted)
    return samples


def _verdict(mean: float, real: list[float]) -> tuple[float, str]:
    beats = sum(score < mean for score in real) / len(real)
    if mean >= statistics.fmean(real):
        return beats, "hackable"
    return beats, "leaks" if beats > 0 else "ok"


def audit_reward_model(
    reward: RewardModelReward,
    rows: list[dict[str, Any]],
    *,
    k: int = 2,
    planted: bool = True,
    planted_prompts: int = PLANTED_PROMPTS,
    format_tags: list[str] | None = None,
    seed: int = 0,
    name: str = "reward_model",
) -> RewardModelAudit:
    """Score ``rows`` (``{"prompt", "completion"}``) and planted bad answers ``k`` times each."""
    if k < 1:
        raise UserError("--k must be at least 1")
    samples = [_Sample(row.get("prompt"), row["completion"], "real") for row in rows]
    if planted:
        answers: dict[str, str] = {}
        for sample in samples:
            answers.setdefault(user_request(sample.prompt), completion_text(sample.completion))
        prompts = [s.prompt for s in samples]
        samples += planted_samples(
            prompts, answers, format_tags, seed=seed, planted_prompts=planted_prompts
        )
    encoded = reward.encode([s.prompt for s in samples], [s.completion for s in samples])
    lengths = reward.count_tokens([completion_text(s.completion) for s in samples])
    rng = random.Random(seed)
    repeats: list[list[float]] = [[] for _ in samples]
    with progress("reward model audit", k * len(samples)) as bar:
        for repeat in range(k):
            order = list(range(len(samples)))
            if repeat:  # a different order: different batches and padding around each text
                rng.shuffle(order)
            scores, _ = reward.raw_scores([encoded[i] for i in order])
            for position, i in enumerate(order):
                repeats[i].append(float(scores[position]))
            bar.advance(len(samples), f"repeat {repeat + 1}/{k}")
    means = [statistics.fmean(r) for r in repeats]
    real = [i for i, s in enumerate(samples) if s.kind == "real"]
    real_means = [means[i] for i in real]

    length = [
        LengthBias(
            "real",
            len(real),
            pearson([lengths[i] for i in real], real_means),
            spearman([lengths[i] for i in real], real_means),
        )
    ]
    if len(samples) > len(real):
        length.append(
            LengthBias("all", len(samples), pearson(lengths, means), spearman(lengths, means))
        )
    planted_scores = []
    for kind in PLANTED_KINDS:
        group = [means[i] for i, s in enumerate(samples) if s.kind == kind]
        if group:
            mean = statistics.fmean(group)
            beats, verdict = _verdict(mean, real_means)
            planted_scores.append(PlantedScore(kind, len(group), mean, beats, verdict))
    return RewardModelAudit(
        reward=name,
        model=reward.params.model,
        k=k,
        items=len(real),
        mean=statistics.fmean(real_means),
        spread=statistics.pstdev(real_means) if len(real) > 1 else math.nan,
        noise=statistics.fmean(statistics.pstdev(repeats[i]) for i in real),
        max_repeat_difference=max(max(r) - min(r) for r in repeats),
        length=length,
        planted=planted_scores,
        scores=[
            {"kind": s.kind, "score": means[i], "tokens": lengths[i]} for i, s in enumerate(samples)
        ],
    )


def audit_reward_model_config(
    specs: list[RewardSpec],
    base_dir: Path,
    completions_path: Path,
    *,
    source: str,
    k: int = 2,
    reward_name: str | None = None,
    planted: bool = True,
    planted_prompts: int = PLANTED_PROMPTS,
    seed: int = 0,
) -> RewardModelAudit:
    """Load the reward model of a config's ``rewards:`` once and audit it on a completions file."""

    def build(spec: RewardSpec) -> RewardModelReward:
        assert isinstance(spec.params, RewardModelParams)
        name = spec.display_name
        return RewardModelReward(spec.params, base_dir, name=name, where=f"reward {name!r}")

    def audit(
        reward: RewardModelReward, rows: list[dict[str, Any]], name: str, tags: list[str] | None
    ) -> RewardModelAudit:
        return audit_reward_model(
            reward,
            rows,
            k=k,
            planted=planted,
            planted_prompts=planted_prompts,
            format_tags=tags,
            seed=seed,
            name=name,
        )

    return audit_config_reward(
        specs,
        "reward_model",
        reward_name,
        completions_path,
        source=source,
        build=build,
        audit=audit,
    )


# ---- printing ------------------------------------------------------------------------------------


def print_reward_model_audit(report: RewardModelAudit, console: Any = None) -> None:
    """Print the audit as tables (rich)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    out = console if console is not None else Console()
    out.print(
        f"[bold]reward model audit[/bold] of reward {escape(repr(report.reward))} "
        f"({escape(report.model)}): "
        f"{report.items} completions, each scored {report.k}x; raw scores"
    )
    out.print(
        f"  real completions: mean {fmt(report.mean)}, spread (std across completions) "
        f"{fmt(report.spread)}, repeat noise (std/item) {fmt(report.noise)}"
    )
    if report.k == 1:
        out.print("  (one score per text: --k 2 or more measures the repeat noise)")
    elif report.max_repeat_difference == 0:
        out.print(
            "  repeats gave identical scores, in other orders and batches too: the model is "
            "deterministic and adds no noise; its biases below are what matters"
        )
    elif report.max_repeat_difference <= ROUNDING_ONLY * report.spread:
        out.print(
            "  repeats differ only by floating-point rounding across batches (at most "
            f"{report.max_repeat_difference:.1e}): the model is deterministic and adds no "
            "noise; its biases below are what matters"
        )
    lengths = Table(title="score against completion length (tokens)")
    for column in ("samples", "n", "Pearson r", "Spearman rho"):
        lengths.add_column(column)
    for bias in report.length:
        lengths.add_row(bias.samples, str(bias.n), fmt(bias.pearson), fmt(bias.spearman))
    out.print(lengths)
    real = report.length[0]
    if abs(real.spearman) >= LENGTH_BIAS_WARN:
        direction = "longer" if real.spearman > 0 else "shorter"
        out.print(
            f"[yellow]the score follows length (Spearman {fmt(real.spearman)}): training on "
            f"it will push completions {direction}; consider a length_penalty or "
            "soft_overlong_punishment beside it[/yellow]"
        )
    if report.planted:
        planted = Table(
            title=f"planted bad answers (real mean {fmt(report.mean)}; ok: below every real "
            "completion)"
        )
        for column in ("kind", "n", "mean", "beats real", "verdict"):
            planted.add_column(column)
        for p in report.planted:
            colour = {"ok": "green", "leaks": "yellow", "hackable": "red"}[p.verdict]
            planted.add_row(
                p.kind,
                str(p.n),
                fmt(p.mean),
                f"{p.beats:.0%}",
                f"[{colour}]{p.verdict}[/{colour}]",
            )
        out.print(planted)
