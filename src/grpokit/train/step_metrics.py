"""What a training step reports: TRL-named metrics, the forecast, and sampled completions.

Pure functions of the step's scored batch and loss outputs, so the loop stays readable and the
numbers can be tested without training.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from grpokit.core.advantages import reward_zero_std_mask
from grpokit.core.forecast import forecast_checks, forecast_for_reward, std_normalized_for
from grpokit.core.losses import LossOutput
from grpokit.data.chat import prompt_text
from grpokit.monitor import text_stats
from grpokit.rewards.compose import RewardScores
from grpokit.rollout.base import RolloutBatch
from grpokit.sampling import ScoredBatch, summarize


def solved_group_mask(
    scores: RewardScores, max_values: list[float | None], group_size: int
) -> torch.Tensor | None:
    """Groups whose every completion reaches every reward's maximum (a reward it did not get
    counts as missed); None when a reward has no maximum.

    scores.per_function: (B, R). Returns (B // group_size,) bool. Its mean is the metric
    ``frac_reward_solved``: zero-std groups that are solved, not stalled.
    """
    if not max_values or any(top is None for top in max_values):
        return None
    top = torch.tensor(max_values, dtype=scores.per_function.dtype)
    at_max = scores.per_function >= top - 1e-9  # NaN compares False
    return at_max.all(dim=1).view(-1, group_size).all(dim=1)


def tool_metrics(rollout: RolloutBatch, names: Sequence[str] = ()) -> dict[str, float]:
    """The tool use of a multi-turn batch (TRL's names): ``tools/call_frequency`` (calls per
    completion), ``tools/failure_frequency`` (share of calls that failed), ``tools/<name>/calls``
    (calls of each tool, those in ``names`` included at 0), ``turns/mean`` and ``turns/max``
    (model turns per completion). grpokit's own: ``tools/unparsed_frequency``, calls per
    completion written outside the tool-call format (``Turn.unparsed``): not run when strict,
    run (and in call_frequency too) with training.tool_call_lenient, so either way it shows how
    many calls the strict format misses. Empty for a single-turn batch."""
    if rollout.turns is None:
        return {}
    calls = [c for turns in rollout.turns for t in turns for c in t.calls]
    per_tool = dict.fromkeys(names, 0)
    for c in calls:
        per_tool[c.name] = per_tool.get(c.name, 0) + 1
    counts = [len(turns) for turns in rollout.turns]
    out = {
        "tools/call_frequency": len(calls) / max(1, len(rollout)),
        "tools/failure_frequency": sum(c.failed for c in calls) / len(calls) if calls else 0.0,
        "tools/unparsed_frequency": sum(t.unparsed for turns in rollout.turns for t in turns)
        / max(1, len(rollout)),
        "turns/mean": sum(counts) / max(1, len(counts)),
        "turns/max": float(max(counts, default=0)),
    }
    out |= {f"tools/{name}/calls": float(n) for name, n in per_tool.items()}
    return out


def unparsed_warning(metrics: Mapping[str, float], *, lenient: bool) -> str | None:
    """What to say when a strict step's model wrote tool calls outside the format (they were not
    run, so GRPO scored answers that never got the tool's result); None otherwise."""
    unparsed = metrics.get("tools/unparsed_frequency", 0.0)
    if lenient or unparsed <= 0:
        return None
    return (
        f"tool calls written outside the tool-call format: {unparsed:.2f} per completion "
        f"(tools/unparsed_frequency; tools/call_frequency {metrics['tools/call_frequency']:.2f}), "
        "JSON naming a tool, bare or in a code block; they were not run. "
        "training.tool_call_lenient: true runs them; a chat template that shows the model its "
        "own call format (model.chat_template: auto) or an SFT on tool-call demonstrations "
        "teaches the format"
    )


def memory_metrics(device: torch.device) -> dict[str, float]:
    """The process's peak memory so far, in GiB (so a step that grows it shows as a rise):
    ``memory/max_rss_gib``, resident host memory (absent where the OS does not report it), and on
    a CUDA device ``memory/max_allocated_gib`` and ``memory/max_reserved_gib``, what tensors took
    and what PyTorch's caching allocator held (verl's ``perf/max_memory_*``). With several
    processes the step's record has the largest of theirs."""
    out: dict[str, float] = {}
    try:
        import resource
    except ImportError:  # not on Windows
        pass
    else:  # ru_maxrss is in KiB on Linux, in bytes on macOS
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out["memory/max_rss_gib"] = kib / (2**30 if sys.platform == "darwin" else 2**20)
    if device.type == "cuda":
        out["memory/max_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        out["memory/max_reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30
    return out


def sampled_tokens(rollout: RolloutBatch) -> list[int]:
    """Tokens the model sampled in each completion. With tools, as in TRL, the tool messages'
    tokens are left out: the model did not generate them."""
    if rollout.tool_mask is None:
        return [len(c) for c in rollout.completion_ids]
    return [sum(m) for m in rollout.tool_mask]


def generation_rate(tokens: int, seconds: float) -> dict[str, float]:
    """``generate/tokens_per_second``: completion tokens sampled per second of rollout (with
    tools, the tools' time included); empty when no time was measured."""
    return {"generate/tokens_per_second": tokens / seconds} if seconds > 0 else {}


def rollout_metrics(
    scored: ScoredBatch,
    max_values: list[float | None],
    *,
    text_ngram: int = 3,
    tool_names: Sequence[str] = (),
) -> dict[str, float]:
    """reward, reward_std, frac_reward_zero_std, completion lengths, per-reward metrics and pass
    rates, the text statistics the reward-hacking monitors read, and with tools
    :func:`tool_metrics`."""
    s = scored.scores
    total = s.total
    valid = total[~torch.isnan(total)]
    lengths = torch.tensor(sampled_tokens(scored.rollout), dtype=torch.float32)
    truncated = torch.tensor([r == "length" for r in scored.rollout.finish_reason])
    terminated = lengths[~truncated]
    g = scored.group_size
    nan = float("nan")
    metrics: dict[str, float] = {
        "reward": float(valid.mean()) if len(valid) else nan,
        # TRL's reward_std: the mean over groups of the within-group std.
        "reward_std": float(total.view(-1, g).nan_to_num(0).std(dim=1).mean())
        if len(valid)
        else nan,
        "frac_reward_zero_std": float(reward_zero_std_mask(total, g).float().mean()),
        "completions/mean_length": float(lengths.mean()),
        "completions/min_length": float(lengths.min()),
        "completions/max_length": float(lengths.max()),
        "completions/clipped_ratio": float(truncated.float().mean()),
        "completions/mean_terminated_length": float(terminated.mean()) if len(terminated) else nan,
    }
    solved = solved_group_mask(s, max_values, g)
    if solved is not None:
        metrics["frac_reward_solved"] = float(solved.float().mean())
    metrics.update(s.metrics)
    for r in summarize(s, max_values):
        if r.pass_rate is not None:
            metrics[f"pass_rate/{r.name}"] = r.pass_rate
    metrics.update(text_stats(scored.texts, g, n=text_ngram))
    metrics.update(tool_metrics(scored.rollout, tool_names))
    return metrics


class LossSums:
    """An optimizer step's loss metrics, summed over its micro-batches on the device and moved to
    the host once (:meth:`to_host`), so the micro-batch loop never waits on the device.

    loss: the weighted micro-batch losses sum to the step's loss. Each loss metric is a mean over
    a micro-batch's active tokens, so the step's is their token-weighted mean, except a metric
    whose last name part holds ``max``: the step's is the largest. entropy: the mean of the
    micro-batches' means (over those with active tokens).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.loss, self.tokens = self._zero(), self._zero()
        self.entropy, self.entropy_batches = self._zero(), self._zero()
        self.weighted: dict[str, torch.Tensor] = {}
        self.largest: dict[str, torch.Tensor] = {}

    def _zero(self) -> torch.Tensor:
        return torch.zeros((), dtype=torch.float64, device=self.device)

    def add(
        self, out: LossOutput, weight: float, mask: torch.Tensor, entropy: torch.Tensor | None
    ) -> None:
        """One micro-batch: its loss output, its weight in the step, its (B, T) loss mask and
        (B, T) per-token entropy."""
        n = mask.detach().sum().double()
        self.loss = self.loss + out.loss.detach().double() * weight
        self.tokens = self.tokens + n
        for key, value in out.metrics.items():
            if "max" in key.rsplit("/", 1)[-1]:
                largest = self.largest.get(key)
                value = value.detach().double()
                self.largest[key] = value if largest is None else torch.maximum(largest, value)
            else:
                self.weighted[key] = self.weighted.get(key, self._zero()) + value.double() * n
        if entropy is not None:
            has_tokens = (n > 0).double()
            mean = (entropy.detach().double() * mask).sum() / n.clamp(min=1.0)
            self.entropy = self.entropy + mean * has_tokens
            self.entropy_batches = self.entropy_batches + has_tokens

    def to_host(self, grad_norm: torch.Tensor) -> tuple[dict[str, float], float]:
        """(metrics: loss, grad_norm, each loss metric, entropy; the step's active tokens), in
        one transfer."""
        keys, extremes = sorted(self.weighted), sorted(self.largest)
        values = torch.stack(
            [
                self.loss,
                grad_norm.detach().double().to(self.loss.device),
                self.tokens,
                self.entropy,
                self.entropy_batches,
                *(self.weighted[k] for k in keys),
                *(self.largest[k] for k in extremes),
            ]
        ).tolist()
        loss, norm, tokens, entropy, batches, *rest = values
        metrics = {"loss": loss, "grad_norm": norm}
        weighted, largest = rest[: len(keys)], rest[len(keys) :]
        metrics.update({k: v / max(tokens, 1.0) for k, v in zip(keys, weighted, strict=True)})
        metrics.update(zip(extremes, largest, strict=True))
        metrics["entropy"] = entropy / batches if batches else float("nan")
        return metrics, tokens


def forecast_metrics(
    metrics: dict[str, float],
    reward_names: list[str],
    *,
    beta: float,
    scale_rewards: str,
    part_names: Sequence[str] = (),
) -> dict[str, float]:
    """Success-amplification forecast from measured pass rates (docs/math.md section 5).

    The idealised optimum of the KL-regularised objective; the trainer logs it once, at the first
    step, so the report can hold the observed pass rates against it. Rewards read their
    ``pass_rate/<name>``; reward parts (a checklist's items, whose means are success rates) their
    ``<part>/pass_rate``; both forecast as ``forecast/<name>/pass_rate``.
    """
    out = {}
    std = std_normalized_for(scale_rewards)
    rates = [(name, f"pass_rate/{name}") for name in reward_names]
    rates += [(name, f"{name}/pass_rate") for name in part_names]
    for name, key in rates:
        rate = metrics.get(key)
        if rate is not None and not math.isnan(rate):
            value = forecast_for_reward(rate, beta=beta, std_normalized=std)
            if value is not None:
                out[f"forecast/{name}/pass_rate"] = value
    return out


def heldout_hint(*, heldout: bool, eval_steps: int | None, eval_interval: int, steps: int) -> str:
    """Why a run logged no held-out pass rate, naming only what is missing or wrong.

    heldout: data.heldout is set. eval_steps: as configured (None: logging_steps).
    eval_interval: steps between held-out evals (0: off). steps: the steps the run took.
    """
    if not heldout:
        return "set data.heldout" + ("" if eval_interval else " and training.eval_steps")
    if not eval_interval:
        return "set training.eval_steps"
    if eval_interval > steps:
        setting = (
            "training.eval_steps"
            if eval_steps is not None
            else "training.logging_steps, eval_steps' default"
        )
        return (
            f"the held-out eval runs every {eval_interval} steps ({setting}), more than the "
            f"run's {steps}: set training.eval_steps to at most {steps}"
        )
    return "no held-out pass rate of it in the run's evals"


def forecast_summary(history: Sequence[Mapping[str, Any]], *, no_heldout: str) -> list[str]:
    """Lines for the end of a run: each forecast beside the held-out pass rate it predicted;
    ``no_heldout`` (:func:`heldout_hint`) says why there is none."""
    lines = []
    for check in forecast_checks(history):
        start = "?" if check.p_ref is None else f"{check.p_ref:.0%}"
        line = f"  {check.name}: pass rate {start} at the start, forecast {check.forecast:.0%}"
        if check.heldout_last is None:
            line += f"; no held-out check logged ({no_heldout})"
        else:
            first = "" if check.heldout_first is None else f"{check.heldout_first:.0%} -> "
            line += f"; held out {first}{check.heldout_last:.0%} (step {check.heldout_step})"
        lines.append(line)
    if lines:
        lines.insert(0, "forecast (the KL-regularised optimum, docs/math.md 5) against held-out:")
    return lines


def completion_records(
    scored: ScoredBatch, *, step: int, limit: int, advantages: torch.Tensor
) -> list[dict[str, Any]]:
    """The first `limit` completions of a step as completions.jsonl rows (None for no reward)."""
    g = scored.group_size
    rows = []
    for j in range(min(limit, len(scored.texts))):
        per = scored.scores.per_function[j].tolist()
        total = float(scored.scores.total[j])
        rows.append(
            {
                "step": step,
                "prompt": prompt_text(scored.rows[j // g].prompt),
                "completion": scored.texts[j],
                "reward": None if math.isnan(total) else total,
                "rewards": {
                    n: (None if math.isnan(v) else v)
                    for n, v in zip(scored.scores.names, per, strict=True)
                },
                "advantage": float(advantages[j]),
            }
        )
        if scored.scores.parts:  # a checklist's items, which `grpokit review` compares with
            rows[-1]["parts"] = {
                n: (None if math.isnan(v := float(column[j])) else v)
                for n, column in scored.scores.parts.items()
            }
        if scored.messages is not None:  # the turns, tool calls and tool results, marked
            rows[-1]["transcript"] = scored.messages[j]
    return rows


def step_summary(record: dict[str, Any]) -> str:
    """The few numbers a progress line shows for a step: reward, KL, equal-reward share and the
    generation speed."""
    parts = [f"reward {record.get('reward', math.nan):.3f}"]
    if "kl" in record:
        parts.append(f"kl {record['kl']:.4f}")
    parts.append(f"zero-std {record.get('frac_reward_zero_std', 0):.2f}")
    rate = record.get("generate/tokens_per_second")
    if rate is not None and math.isfinite(rate):
        parts.append(f"gen {rate:.1f} tok/s" if rate < 100 else f"gen {rate:.0f} tok/s")
    return "  ".join(parts)
