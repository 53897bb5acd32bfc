"""``grpokit eval``: base vs trained models on held-out prompts, with intervals.

Every model answers every held-out prompt K times with the same sampling settings and the same
seeds (prompt chunk c is sampled with seed + c for each model), and every configured reward
scores the answers (a judge reward keeps its cache under the output directory). The result is the
seed article's per-prompt table, per-reward means and pass rates with 95% per-prompt (cluster)
intervals, pass@k, mean length, and a paired comparison of each model with the first one (the
base). The K samples of one prompt are correlated (an easy prompt passes in most of them), so
every interval treats the prompts, not the samples, as the independent units.

Writes ``eval.json`` (format in :mod:`grpokit.evaluate.schema`), ``completions.jsonl`` (every
sample) and ``eval.md`` (the tables) to the output directory.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from grpokit.config import GRPOKitConfig, load_config
from grpokit.core.stats import (
    cluster_mean_stderr,
    cluster_pass_interval,
    length_adjusted_difference,
    paired_difference,
    pass_at_k,
    t_quantile_975,
)
from grpokit.data.chat import prompt_text
from grpokit.data.prompts import PromptRow, check_columns, load_prompts
from grpokit.errors import UserError
from grpokit.evaluate.schema import (
    CLUSTER_INTERVALS,
    EvalResult,
    ModelSummary,
    PairedComparison,
    PartSummary,
    PromptResult,
    RewardSummary,
    TranscriptSample,
)
from grpokit.evaluate.tables import eval_tables, to_markdown, transcripts_markdown
from grpokit.files import write_atomic
from grpokit.monitor.config import MonitorConfig
from grpokit.monitor.text_stats import (
    DISTINCT_2,
    MAX_GROUP_DUPLICATE_FRAC,
    REPEATED_NGRAM_FRAC,
    text_stats,
)
from grpokit.rewards.compose import RewardSet, build_reward_set
from grpokit.rewards.registry import BuildContext
from grpokit.sampling import (
    ModelSpec,
    Sample,
    Sampler,
    resolve_device,
    resolve_model,
    seed_everything,
    unique_labels,
)


def parse_thresholds(items: Sequence[str], names: Sequence[str]) -> dict[str, float]:
    """``NAME=VALUE`` pass thresholds from the command line."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in names:
            raise UserError(
                f"--pass {item!r}: expected REWARD=VALUE with REWARD one of {', '.join(names)}"
            )
        try:
            out[name] = float(value)
        except ValueError:
            raise UserError(f"--pass {item!r}: {value!r} is not a number") from None
    return out


# ---- the tables, from scored samples (pure) ------------------------------------------------------


def _passes(value: float | None, threshold: float) -> bool:
    return value is not None and value >= threshold - 1e-9


def _ks(k_max: int) -> list[int]:
    ks, k = [], 1
    while k <= k_max:
        ks.append(k)
        k *= 2
    if ks[-1] != k_max:
        ks.append(k_max)
    return ks


def _reward_summary(
    values: list[float | None], per_prompt: list[list[float | None]], threshold: float | None
) -> RewardSummary:
    present = [v for v in values if v is not None]
    n = len(present)
    mean = sum(present) / n if n else None
    std = (
        math.sqrt(sum((v - mean) ** 2 for v in present) / (n - 1))
        if mean is not None and n > 1
        else None
    )
    passed = pass_rate = ci = None
    at_k: dict[int, float] = {}
    if threshold is not None and n:
        passed = sum(_passes(v, threshold) for v in present)
        pass_rate = passed / n
        ci = cluster_pass_interval(
            [[_passes(v, threshold) for v in p if v is not None] for p in per_prompt]
        )
        k_max = min(len(p) for p in per_prompt)
        if k_max >= 1:
            for k in _ks(k_max):
                at_k[k] = sum(
                    pass_at_k(len(p), sum(_passes(v, threshold) for v in p), k) for p in per_prompt
                ) / len(per_prompt)
    return RewardSummary(
        mean=mean,
        std=std,
        n=n,
        none_count=len(values) - n,
        threshold=threshold,
        passed=passed,
        pass_rate=pass_rate,
        pass_ci=ci,
        pass_at_k=at_k,
    )


def part_metric(part: str) -> str:
    """The held-out metric of a reward part: ``checklist/<item>`` -> its
    ``eval/checklist/<item>/pass_rate``."""
    return f"eval/{part}/pass_rate"


def _metric_value(sample: Sample, key: str) -> float | None:
    """A sample's value of a reward, or of a reward part named by its held-out metric."""
    if key in sample.rewards:
        return sample.rewards[key]
    if key.startswith("eval/") and key.endswith("/pass_rate"):
        return sample.parts.get(key[len("eval/") : -len("/pass_rate")])
    return None


def part_summary(values_per_prompt: Sequence[Sequence[float | None]]) -> PartSummary:
    """A reward part's success rate over samples with a per-prompt (cluster) 95% interval.

    values_per_prompt: per prompt, the part's value in each sample (None: not applicable).
    0/1 values get :func:`cluster_pass_interval`; probabilities a t interval (prompts - 1 df)
    on :func:`cluster_mean_stderr`, clipped to [0, 1], None with fewer than two prompts.

    >>> part_summary([[1.0, 0.0], [1.0, None]]).pass_rate
    0.6666666666666666
    """
    groups = [[v for v in g if v is not None] for g in values_per_prompt]
    groups = [g for g in groups if g]
    n = sum(len(g) for g in groups)
    if n == 0:
        return PartSummary(pass_rate=None, ci=None, n=0)
    rate = sum(sum(g) for g in groups) / n
    ci: tuple[float, float] | None
    if all(v in (0.0, 1.0) for g in groups for v in g):
        ci = cluster_pass_interval([[v == 1.0 for v in g] for g in groups])
    else:
        stderr = cluster_mean_stderr(groups)
        if stderr is None:
            ci = None
        else:
            half = t_quantile_975(len(groups) - 1) * stderr
            ci = (max(0.0, rate - half), min(1.0, rate + half))
    return PartSummary(pass_rate=rate, ci=ci, n=n)


def _prompt_means(
    samples: Sequence[Sample], n_prompts: int, key: str | None, thresholds: Mapping[str, float]
) -> list[float | None]:
    """Per prompt: the mean of a reward or reward part's metric (key) or, with key None, the
    compliant share."""
    out: list[float | None] = []
    for i in range(n_prompts):
        at = [s for s in samples if s.prompt_index == i]
        if key is None:
            out.append(sum(_compliant(s, thresholds) for s in at) / len(at) if at else None)
        else:
            vals = [_metric_value(s, key) for s in at]
            present = [v for v in vals if v is not None]
            out.append(sum(present) / len(present) if present else None)
    return out


TRANSCRIPT_PROMPTS = 3
"""Prompts whose transcripts eval.json and eval.md show (all are in completions.jsonl)."""


def pick_transcripts(
    samples: Sequence[Sample], labels: Sequence[str], n_prompts: int
) -> list[TranscriptSample]:
    """One transcript per model for each of the first :data:`TRANSCRIPT_PROMPTS` prompts: the
    first sample that called a tool, else the first sample (none without tools)."""
    out = []
    for i in range(min(n_prompts, TRANSCRIPT_PROMPTS)):
        for label in labels:
            at = [s for s in samples if s.model == label and s.prompt_index == i and s.transcript]
            called = [s for s in at if any(m.get("role") == "tool" for m in s.transcript or [])]
            if at:
                shown = (called or at)[0]
                messages = shown.transcript or []
                out.append(TranscriptSample(model=label, prompt_index=i, sample=shown.sample,
                                            messages=messages))  # fmt: skip
    return out


def _compliant(sample: Sample, thresholds: Mapping[str, float]) -> bool:
    return all(_passes(sample.rewards.get(n), t) for n, t in thresholds.items())


def eval_alerts(
    config: MonitorConfig, base: ModelSummary, other: ModelSummary
) -> list[dict[str, object]]:
    """Monitor rules that compare a model's samples with the base model's.

    The training monitors watch trends over steps; here there are two points, the base and the
    trained model, so each rule compares the two with its own thresholds.
    """
    alerts: list[dict[str, object]] = []

    def add(rule: str, value: float, message: str) -> None:
        alerts.append({"rule": rule, "model": other.label, "value": value, "message": message})

    bt, ot = base.text, other.text
    if config.repetition.enabled and REPEATED_NGRAM_FRAC in bt and REPEATED_NGRAM_FRAC in ot:
        rise = ot[REPEATED_NGRAM_FRAC] - bt[REPEATED_NGRAM_FRAC]
        if rise >= config.repetition.max_increase:
            add("repetition", ot[REPEATED_NGRAM_FRAC],
                f"{other.label}: repeated n-gram share {ot[REPEATED_NGRAM_FRAC]:.2f} vs "
                f"{bt[REPEATED_NGRAM_FRAC]:.2f} for {base.label}")  # fmt: skip
        elif ot.get(DISTINCT_2, 1.0) < config.repetition.min_distinct_ratio * bt.get(
            DISTINCT_2, 1.0
        ):
            add("repetition", ot[DISTINCT_2],
                f"{other.label}: distinct-2 {ot[DISTINCT_2]:.2f} vs {bt[DISTINCT_2]:.2f} for "
                f"{base.label}")  # fmt: skip
    if config.group_dominance.enabled and MAX_GROUP_DUPLICATE_FRAC in ot:
        dup = ot[MAX_GROUP_DUPLICATE_FRAC]
        if dup >= config.group_dominance.max_duplicate_frac > bt.get(MAX_GROUP_DUPLICATE_FRAC, 0):
            add("group_dominance", dup,
                f"{other.label}: one text fills {dup:.0%} of a prompt's samples")  # fmt: skip
    if config.length_reward.enabled and base.mean_length > 0:
        growth = (other.mean_length - base.mean_length) / base.mean_length
        higher = [
            r for r, s in other.rewards.items()
            if s.mean is not None and (b := base.rewards.get(r)) is not None and b.mean is not None
            and s.mean > b.mean
        ]  # fmt: skip
        if growth >= config.length_reward.min_rel_growth and higher:
            add("length_reward", growth,
                f"{other.label}: completions {growth:.0%} longer than {base.label}'s "
                f"({base.mean_length:.0f} -> {other.mean_length:.0f} tokens) with higher "
                f"{', '.join(higher)}: check that the reward does not pay for length")  # fmt: skip
    return alerts


def summarize_eval(
    samples: Sequence[Sample],
    *,
    labels: Sequence[str],
    paths: Mapping[str, str],
    prompts: Sequence[str],
    samples_per_prompt: int,
    reward_names: Sequence[str],
    thresholds: Mapping[str, float],
    seed: int,
    sampling: Mapping[str, float | int | None],
    heldout: str,
    monitors: MonitorConfig | None = None,
    seconds: Mapping[str, float] | None = None,
    group_texts: Mapping[str, list[str]] | None = None,
    part_names: Sequence[str] = (),
    among: Sequence[str] = (),
) -> EvalResult:
    """Build the eval tables from scored samples (no model needed: testable by hand).

    ``thresholds`` holds the pass threshold of each reward that has one; a sample is compliant
    when it passes all of them (no thresholds: no compliant counts). ``part_names``: the reward
    parts (a checklist's items, ``checklist/<item>``) whose success rates are summarised and
    compared as ``eval/checklist/<item>/pass_rate``. ``among``: rewards with a threshold whose
    passing samples get a paired comparison of their own (every other reward and part, over
    those samples only), e.g. a judged score over the formatted answers alone.
    """
    for name in among:
        if name not in thresholds:
            raise ValueError(f"among: {name!r} has no pass threshold (thresholds: {thresholds})")
    n_prompts = len(prompts)
    by_model = {label: [s for s in samples if s.model == label] for label in labels}
    models = [
        _model_summary(
            label,
            by_model[label],
            path=paths.get(label, label),
            n_prompts=n_prompts,
            samples_per_prompt=samples_per_prompt,
            reward_names=reward_names,
            thresholds=thresholds,
            part_names=part_names,
            texts=(group_texts or {}).get(label),
            seconds=(seconds or {}).get(label, 0.0),
        )
        for label in labels
    ]
    rows = [
        _prompt_row(i, prompt, by_model, samples_per_prompt, reward_names, thresholds)
        for i, prompt in enumerate(prompts)
    ]
    metrics: list[str | None] = list(reward_names) + ([None] if thresholds else [])
    metrics += [part_metric(part) for part in part_names]
    paired = _paired(by_model, labels, n_prompts, metrics, thresholds)
    for name in among:
        passing = {
            label: [s for s in mine if _passes(s.rewards.get(name), thresholds[name])]
            for label, mine in by_model.items()
        }
        kept = [m for m in metrics if m is not None and m != name]
        paired += _paired(passing, labels, n_prompts, kept, thresholds, among=name)
    alerts: list[dict[str, object]] = []
    if monitors is not None and monitors.enabled:
        for m in models[1:]:
            alerts.extend(eval_alerts(monitors, models[0], m))
    return EvalResult(
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        heldout=heldout,
        samples_per_prompt=samples_per_prompt,
        seed=seed,
        sampling=dict(sampling),
        rewards=list(reward_names),
        thresholds=dict(thresholds),
        models=models,
        prompts=rows,
        paired=paired,
        alerts=alerts,
        transcripts=pick_transcripts(samples, labels, n_prompts),
        intervals=CLUSTER_INTERVALS,
    )


def _per_prompt(mine: Sequence[Sample], n_prompts: int, value: Any) -> list[list[Any]]:
    """``value(sample)`` of a model's samples, one list per prompt."""
    return [[value(s) for s in mine if s.prompt_index == i] for i in range(n_prompts)]


def _model_summary(
    label: str,
    mine: Sequence[Sample],
    *,
    path: str,
    n_prompts: int,
    samples_per_prompt: int,
    reward_names: Sequence[str],
    thresholds: Mapping[str, float],
    part_names: Sequence[str],
    texts: list[str] | None,
    seconds: float,
) -> ModelSummary:
    """One model's row of the summary, from its samples ``mine``."""
    if not mine:
        raise ValueError(f"no samples for model {label!r}")
    rewards = {
        name: _reward_summary(
            [s.rewards.get(name) for s in mine],
            _per_prompt(mine, n_prompts, lambda s, name=name: s.rewards.get(name)),
            thresholds.get(name),
        )
        for name in reward_names
    }
    compliant = sum(_compliant(s, thresholds) for s in mine) if thresholds else None
    compliant_ci = (
        cluster_pass_interval(_per_prompt(mine, n_prompts, lambda s: _compliant(s, thresholds)))
        if compliant is not None
        else None
    )
    return ModelSummary(
        label=label,
        path=path,
        samples=len(mine),
        compliant=compliant,
        compliant_rate=compliant / len(mine) if compliant is not None else None,
        compliant_ci=compliant_ci,
        mean_length=sum(s.length for s in mine) / len(mine),
        truncated_frac=sum(s.truncated for s in mine) / len(mine),
        text=text_stats(texts if texts is not None else [s.text for s in mine], samples_per_prompt),
        rewards=rewards,
        checklist={
            part_metric(part): part_summary(
                _per_prompt(mine, n_prompts, lambda s, part=part: s.parts.get(part))
            )
            for part in part_names
        },
        seconds=seconds,
    )


def _prompt_row(
    i: int,
    prompt: str,
    by_model: Mapping[str, Sequence[Sample]],
    samples_per_prompt: int,
    reward_names: Sequence[str],
    thresholds: Mapping[str, float],
) -> PromptResult:
    """Prompt ``i``'s row: each model's compliant count and mean of each reward."""
    compliant_counts: dict[str, int] = {}
    means: dict[str, dict[str, float | None]] = {}
    for label, mine in by_model.items():
        at = [s for s in mine if s.prompt_index == i]
        if thresholds:
            compliant_counts[label] = sum(_compliant(s, thresholds) for s in at)
        means[label] = {}
        for name in reward_names:
            present = [v for s in at if (v := s.rewards.get(name)) is not None]
            means[label][name] = sum(present) / len(present) if present else None
    return PromptResult(
        index=i,
        prompt=prompt,
        samples=samples_per_prompt,
        compliant=compliant_counts,
        reward_mean=means,
    )


def _paired(
    by_model: Mapping[str, Sequence[Sample]],
    labels: Sequence[str],
    n_prompts: int,
    metrics: Sequence[str | None],
    thresholds: Mapping[str, float],
    *,
    among: str | None = None,
) -> list[PairedComparison]:
    """Each model against the first on each metric (None: the compliant rate), paired by
    prompt: the mean difference other - base with a t interval over prompts. ``among`` names
    the reward whose passing samples ``by_model`` was narrowed to (None: every sample); a prompt
    where either model has no such sample drops out of the pairs."""
    paired: list[PairedComparison] = []
    base = labels[0]
    for other in labels[1:]:
        for key in metrics:
            a = _prompt_means(by_model[base], n_prompts, key, thresholds)
            b = _prompt_means(by_model[other], n_prompts, key, thresholds)
            pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
            if not pairs:
                continue
            xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
            # None with a single prompt: no interval.
            result = paired_difference(ys, xs) if len(pairs) > 1 else None
            diff = sum(y - x for x, y in pairs) / len(pairs)
            paired.append(
                PairedComparison(
                    metric=key or "compliant",
                    base=base,
                    other=other,
                    diff=diff,
                    ci=(result[1], result[2]) if result else None,
                    n_prompts=len(pairs),
                    at_equal_length=_at_equal_length(
                        by_model[base], by_model[other], key, thresholds
                    ),
                    among=among,
                )
            )
    return paired


def _at_equal_length(
    base: Sequence[Sample],
    other: Sequence[Sample],
    key: str | None,
    thresholds: Mapping[str, float],
) -> tuple[float, float, float] | None:
    """The difference other - base among answers of equal length, with its interval over
    prompts (:func:`length_adjusted_difference` on every scored sample of the two models)."""
    rows: list[tuple[int, bool, float, float]] = []
    for is_other, samples in ((False, base), (True, other)):
        for s in samples:
            value = float(_compliant(s, thresholds)) if key is None else _metric_value(s, key)
            if value is not None:
                rows.append((s.prompt_index, is_other, float(s.length), value))
    return length_adjusted_difference(rows)


# ---- sampling --------------------------------------------------------------------------------------


def _score_model(
    spec: ModelSpec,
    rows: list[PromptRow],
    reward_set: RewardSet,
    cfg: GRPOKitConfig,
    *,
    samples: int,
    seed: int,
    device: torch.device,
    batch_size: int,
    log: Callable[[str], None],
) -> list[Sample]:
    seed_everything(seed)
    sampler = Sampler.from_config(cfg, reward_set, model=spec, device=device)
    return sampler.model_samples(
        spec.label, rows, samples, seed=seed, batch_size=batch_size, log=log
    )


@dataclass(frozen=True)
class _EvalSetup:
    """What sampling and tabulating share once the arguments are read: the models (the base
    first), the config, the held-out rows, the rewards that score the samples, their names and
    each reward's pass threshold."""

    specs: list[ModelSpec]
    cfg: GRPOKitConfig
    rows: list[PromptRow]
    reward_set: RewardSet
    names: list[str]
    limits: dict[str, float]


@dataclass(frozen=True)
class _Sampled:
    """Every model's scored samples, model after model, and the seconds each model took."""

    samples: list[Sample]
    seconds: dict[str, float]


def run_eval(
    models: Sequence[str],
    prompts_path: Path,
    *,
    samples: int,
    out_dir: Path,
    config: Path | None = None,
    seed: int = 0,
    max_prompts: int | None = None,
    thresholds: Sequence[str] = (),
    among: Sequence[str] = (),
    batch_size: int = 32,
    device: str | None = None,
    log: Any = print,
) -> EvalResult:
    """Sample, score and tabulate; writes eval.json, completions.jsonl and eval.md to out_dir."""
    if not models:
        raise UserError("give at least one --model (the base model first)")
    if samples < 1:
        raise UserError("--samples must be at least 1")
    setup = _set_up(
        models, prompts_path, out_dir, config=config, seed=seed, max_prompts=max_prompts,
        thresholds=thresholds, among=among, log=log,
    )  # fmt: skip
    dev = resolve_device(device or setup.cfg.model.device)
    sampled = _sample_models(
        setup, samples=samples, seed=seed, device=dev, batch_size=batch_size, log=log
    )
    result = _tabulate(
        setup, sampled, samples=samples, seed=seed, heldout=str(prompts_path), among=among
    )
    _write_outputs(out_dir, result, sampled.samples)
    return result


def _set_up(
    models: Sequence[str],
    prompts_path: Path,
    out_dir: Path,
    *,
    config: Path | None,
    seed: int,
    max_prompts: int | None,
    thresholds: Sequence[str],
    among: Sequence[str],
    log: Callable[[str], None],
) -> _EvalSetup:
    """Resolve the models, read the config and the held-out rows, build the rewards and set the
    pass thresholds: the arguments that do not fit the config or the prompts fail here, before
    any model samples."""
    specs = unique_labels([resolve_model(m) for m in models])
    cfg = load_config(_config_path(specs, config, log))
    rows = load_prompts(
        prompts_path, prompt_column=cfg.data.prompt_column, columns=cfg.data.columns
    )
    if max_prompts is not None:
        rows = rows[:max_prompts]
    # Before the rewards: a judge reward keeps its cache under the output directory.
    out_dir.mkdir(parents=True, exist_ok=True)
    reward_set = build_reward_set(
        cfg.rewards, BuildContext(base_dir=cfg.config_dir, run_dir=out_dir, seed=seed)
    )
    names = list(reward_set.names)
    check_columns(rows, reward_set.required_columns, str(prompts_path))
    limits = _pass_limits(reward_set, names, thresholds, among)
    return _EvalSetup(specs, cfg, rows, reward_set, names, limits)


def _config_path(
    specs: Sequence[ModelSpec], config: Path | None, log: Callable[[str], None]
) -> Path:
    """The config given, else the config.yaml of the first model that comes from a run
    directory, so that a trained model is scored and sampled as it was trained."""
    if config is not None:
        return config
    found = next((s.run_dir / "config.yaml" for s in specs if s.run_dir is not None), None)
    if found is None:
        raise UserError(
            "give --config CONFIG.yaml (its rewards score the samples, its training section "
            "sets the sampling), or a --model from a run directory, whose config.yaml is used"
        )
    log(f"using the rewards and sampling of {found}")
    return found


def _pass_limits(
    reward_set: RewardSet, names: list[str], thresholds: Sequence[str], among: Sequence[str]
) -> dict[str, float]:
    """Each reward's pass threshold: its maximum value where it has one, or what ``--pass`` sets.
    An ``--among`` reward needs one, since its passing samples are the ones compared; the rewards
    are closed before that error, as nothing will sample with them."""
    limits = {
        n: float(m) for n, m in zip(names, reward_set.max_values, strict=True) if m is not None
    }
    limits.update(parse_thresholds(thresholds, names))
    for name in among:
        if name not in limits:
            reward_set.close()
            raise UserError(
                f"--among {name!r}: expected a reward with a pass threshold, one of "
                f"{', '.join(limits) or '(none: give one with --pass REWARD=VALUE)'}"
            )
    return limits


def _sample_models(
    setup: _EvalSetup,
    *,
    samples: int,
    seed: int,
    device: torch.device,
    batch_size: int,
    log: Callable[[str], None],
) -> _Sampled:
    """Every model answers every row ``samples`` times with the same seed, timed model by model;
    the rewards are closed after the last model, or when sampling fails."""
    all_samples: list[Sample] = []
    seconds: dict[str, float] = {}
    try:
        for spec in setup.specs:
            log(f"{spec.label}: {len(setup.rows)} prompts x {samples} samples ({spec.given})")
            t0 = time.perf_counter()
            all_samples += _score_model(
                spec, setup.rows, setup.reward_set, setup.cfg, samples=samples, seed=seed,
                device=device, batch_size=batch_size, log=log,
            )  # fmt: skip
            seconds[spec.label] = time.perf_counter() - t0
    finally:
        setup.reward_set.close()
    return _Sampled(all_samples, seconds)


def _tabulate(
    setup: _EvalSetup,
    sampled: _Sampled,
    *,
    samples: int,
    seed: int,
    heldout: str,
    among: Sequence[str],
) -> EvalResult:
    """The tables (:func:`summarize_eval`) of the scored samples, with the config's sampling
    settings and monitors, so that eval.json says how the samples were drawn."""
    training = setup.cfg.training
    return summarize_eval(
        sampled.samples,
        labels=[s.label for s in setup.specs],
        paths={s.label: s.given for s in setup.specs},
        prompts=[prompt_text(r.prompt) for r in setup.rows],
        samples_per_prompt=samples,
        reward_names=setup.names,
        thresholds=setup.limits,
        seed=seed,
        sampling={
            "temperature": training.temperature,
            "top_p": training.top_p,
            "top_k": training.top_k,
            "max_completion_length": training.max_completion_length,
        },
        heldout=heldout,
        monitors=setup.cfg.monitors,
        seconds=sampled.seconds,
        part_names=setup.reward_set.part_names,
        among=among,
    )


def _write_outputs(out_dir: Path, result: EvalResult, samples: Sequence[Sample]) -> None:
    """completions.jsonl (every sample), eval.md and eval.json, each written atomically."""
    lines = "".join(
        json.dumps(_completion_record(s, result.prompts[s.prompt_index].prompt), ensure_ascii=False)
        + "\n"
        for s in samples
    )
    write_atomic(out_dir / "completions.jsonl", lines)
    write_atomic(out_dir / "eval.md", render_markdown(result))
    write_atomic(out_dir / "eval.json", result.model_dump_json(indent=1))


def _completion_record(s: Sample, prompt: str) -> dict[str, Any]:
    """One line of completions.jsonl: a sample with its prompt's text; its parts only where a
    reward reported some, its transcript only where it has one (with tools)."""
    return {
        "model": s.model,
        "prompt_index": s.prompt_index,
        "sample": s.sample,
        "prompt": prompt,
        "completion": s.text,
        "reward": s.total,
        "rewards": s.rewards,
        "length": s.length,
        "truncated": s.truncated,
        **({"parts": s.parts} if s.parts else {}),
        **({"transcript": s.transcript} if s.transcript is not None else {}),
    }


def render_markdown(result: EvalResult) -> str:
    """The tables and alerts as Markdown, for the terminal and eval.md."""
    text = to_markdown(eval_tables(result)) + transcripts_markdown(result)
    if result.alerts:
        text += "\n### Monitor alerts\n\n" + "\n".join(
            f"- [{a.get('rule')}] {a.get('message')}" for a in result.alerts
        )
        text += "\n"
    return text
