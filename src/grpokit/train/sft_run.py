"""The work of `grpokit sft`: a supervised warm-start that `grpokit train` can start from
(model.init_from).

Two sources of training pairs:

- ``--data demos.jsonl``: prompt/completion demonstrations (e.g. written by hand or by a script);
- ``--from-rollouts``: rejection sampling from the model itself. Its completions are sampled
  exactly as preflight and training sample them, scored with the configured rewards, and the ones
  that reach the threshold are kept and fine-tuned on (self-distillation). No human
  demonstrations are needed when at least a few samples pass.

The loss covers completion tokens only (``run_sft``). LoRA or full fine-tuning follows the
config's ``model.lora`` unless ``--full`` / ``--lora`` says otherwise.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from grpokit.config import GRPOKitConfig
from grpokit.data.prompts import PromptRow
from grpokit.errors import UserError
from grpokit.files import write_jsonl
from grpokit.sampling import Sampler, ScoredBatch
from grpokit.sampling.groups import choose_prompts, open_sampler, sample_groups
from grpokit.train.sft import Demonstration, load_demonstrations, run_sft
from grpokit.train.sft_defaults import DEFAULT_LR_FULL, DEFAULT_LR_LORA, DEFAULT_STEPS

ROLLOUTS_FILE = "sft_rollouts.jsonl"
"""Written next to the SFT checkpoint with --from-rollouts: the kept samples, as demonstrations."""


_NO_MAXIMUM = (
    "--from-rollouts: no configured reward has a known maximum; choose what passes with "
    "--reward NAME --threshold X (or --threshold X for the total reward)"
)


@dataclass(frozen=True)
class Criterion:
    """What a sample must reach to be kept.

    reward: the name of one reward, or None. threshold: its minimum (or, with reward None, the
    total reward's minimum). With both None, every reward with a maximum must be at it.
    A None (not applicable) value never passes.
    """

    reward: str | None = None
    threshold: float | None = None

    def describe(self, names: list[str], max_values: list[float | None]) -> str:
        if self.reward is not None:
            return f"{self.reward} >= {self._threshold_for(names, max_values):g}"
        if self.threshold is not None:
            return f"total reward >= {self.threshold:g}"
        bounded = [f"{n} = {m:g}" for n, m in zip(names, max_values, strict=True) if m is not None]
        if not bounded:
            raise UserError(_NO_MAXIMUM)
        return "every bounded reward at its maximum (" + ", ".join(bounded) + ")"

    def _threshold_for(self, names: list[str], max_values: list[float | None]) -> float:
        assert self.reward is not None
        if self.reward not in names:
            raise UserError(
                f"--reward {self.reward!r} is not a configured reward; known: {', '.join(names)}"
            )
        if self.threshold is not None:
            return self.threshold
        top = max_values[names.index(self.reward)]
        if top is None:
            raise UserError(
                f"--reward {self.reward!r} has no known maximum; give --threshold as well"
            )
        return top

    def passing(self, batch: ScoredBatch, max_values: list[float | None]) -> torch.Tensor:
        """(B,) bool: which samples of the batch pass."""
        s = batch.scores
        names = s.names
        if self.reward is not None:
            threshold = self._threshold_for(names, max_values)
            return s.per_function[:, names.index(self.reward)] >= threshold - 1e-9
        if self.threshold is not None:
            return s.total >= self.threshold - 1e-9
        bounded = [j for j, m in enumerate(max_values) if m is not None]
        if not bounded:
            raise UserError(_NO_MAXIMUM)
        ok = torch.ones(s.per_function.shape[0], dtype=torch.bool)
        for j in bounded:
            top = max_values[j]
            assert top is not None
            ok &= s.per_function[:, j] >= top - 1e-9  # NaN compares False: never passes
        return ok


@dataclass
class Selection:
    """The outcome of rejection sampling: the kept demonstrations and what they came from."""

    demos: list[Demonstration]
    sampled: int
    passed: int
    criterion: str
    batches: list[ScoredBatch] = field(default_factory=list)


def select_passing(
    batches: list[ScoredBatch], criterion: Criterion, max_values: list[float | None]
) -> Selection:
    """Keep the passing completions of scored batches as demonstrations (duplicates once)."""
    demos: list[Demonstration] = []
    seen: set[tuple[str, str]] = set()
    sampled = passed = 0
    names = batches[0].scores.names if batches else []
    for batch in batches:
        ok = criterion.passing(batch, max_values).tolist()
        sampled += len(ok)
        for row, keep in enumerate(ok):
            if not keep:
                continue
            passed += 1
            prompt_row: PromptRow = batch.rows[batch.rollout.prompt_index(row)]
            text = batch.texts[row]
            key = (json.dumps(prompt_row.prompt, sort_keys=True), text)
            if key in seen or not text.strip():
                continue
            seen.add(key)
            demos.append(Demonstration(prompt_row.prompt, text))
    return Selection(demos, sampled, passed, criterion.describe(names, max_values), list(batches))


def write_demonstrations(path: Path, demos: list[Demonstration]) -> None:
    """JSONL with prompt and completion, the format --data reads."""
    write_jsonl(path, ({"prompt": d.prompt, "completion": d.completion} for d in demos))


@dataclass
class SFTResult:
    output: Path
    history: list[dict[str, float]]
    demos: int
    selection: Selection | None = None


def run_sft_from_config(
    cfg: GRPOKitConfig,
    *,
    output: Path,
    data: Path | None = None,
    from_rollouts: bool = False,
    criterion: Criterion | None = None,
    prompts: int = 32,
    generations: int | None = None,
    min_kept: int = 4,
    steps: int = DEFAULT_STEPS,
    batch_size: int = 8,
    learning_rate: float | None = None,
    lora: bool | None = None,
    seed: int | None = None,
    log: Any = print,
) -> SFTResult:
    """Warm-start the configured model on demonstrations or on its own passing samples and save
    a checkpoint to `output` (a LoRA adapter or a full model) that model.init_from accepts.
    A final loss that is not finite is an error (after the save, so the checkpoint can be read)."""
    _check_sft_args(cfg, data, from_rollouts, steps, batch_size)
    demos = load_demonstrations(data) if data is not None else []
    use_lora = (cfg.model.lora is not None) if lora is None else lora
    if use_lora and cfg.model.lora is None:
        cfg = cfg.model_copy(deep=True)
        from grpokit.config import LoraConfig

        cfg.model.lora = LoraConfig.model_validate({})
    seed = cfg.training.seed if seed is None else seed
    sampler, train_rows = open_sampler(cfg, trainable=use_lora)
    selection: Selection | None = None
    try:
        if from_rollouts:
            g = generations if generations is not None else cfg.training.num_generations
            rows = choose_prompts(train_rows, prompts, seed=seed)
            selection = _passing_samples(
                sampler, cfg, rows, g, criterion or Criterion(), min_kept, seed, log
            )
            demos = selection.demos
    finally:
        sampler.rewards.close()
    lr = (
        learning_rate
        if learning_rate is not None
        else (DEFAULT_LR_LORA if use_lora else DEFAULT_LR_FULL)
    )
    policy = sampler.policy
    log(
        f"SFT ({'LoRA' if use_lora else 'full'}): {steps} steps, batch {batch_size}, lr {lr:g}, "
        f"on {len(demos)} pairs"
    )
    history = run_sft(
        policy.model,
        policy.tokenizer,
        demos,
        policy.trainable_parameters(),
        system_prompt=sampler.system_prompt,
        max_steps=steps,
        batch_size=batch_size,
        learning_rate=lr,
        max_prompt_length=cfg.training.max_prompt_length,
        chat_template_kwargs=cfg.training.chat_template_kwargs,
        tools=sampler.tools.schemas if sampler.tools is not None else None,
        seed=seed,
        device=next(policy.model.parameters()).device,
        log=log,
    )
    policy.metadata["sft"] = {
        "source": "rollouts" if from_rollouts else str(data),
        "pairs": len(demos),
        "steps": steps,
        "batch_size": batch_size,
        "learning_rate": lr,
        "final_loss": history[-1]["loss"],
        "final_entropy": history[-1]["entropy"],
    }
    policy.save(output)
    if selection is not None:
        write_demonstrations(output / ROLLOUTS_FILE, selection.demos)
    final_loss = history[-1]["loss"]
    if not math.isfinite(final_loss):
        raise UserError(f"SFT ended with loss {final_loss}; lower --learning-rate")
    return SFTResult(output, history, len(demos), selection)


def _check_sft_args(
    cfg: GRPOKitConfig, data: Path | None, from_rollouts: bool, steps: int, batch_size: int
) -> None:
    """What ``grpokit sft`` refuses before loading anything."""
    if (data is None) == (not from_rollouts):
        raise UserError("give exactly one of --data DEMOS.jsonl or --from-rollouts")
    if steps < 1:
        raise UserError(f"--steps must be >= 1, got {steps}")
    if batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {batch_size}")
    if from_rollouts and (cfg.tools or cfg.environment_factory):
        raise UserError(
            "--from-rollouts: the config has tools, and sampled tool conversations cannot be "
            "kept as demonstrations yet; write demonstrations with tool messages and give them "
            "with --data (docs/demo.md)"
        )


def _passing_samples(
    sampler: Sampler,
    cfg: GRPOKitConfig,
    rows: list[PromptRow],
    g: int,
    criterion: Criterion,
    min_kept: int,
    seed: int,
    log: Any,
) -> Selection:
    """The model's own samples of ``rows`` (``g`` each) that pass ``criterion``: at least
    ``min_kept`` distinct ones, or a UserError that says how to get more."""
    # A misnamed reward or missing maximum fails before minutes of sampling.
    criterion.describe(sampler.rewards.names, sampler.rewards.max_values)
    log(f"sampling {len(rows)} prompts x {g} generations to keep the passing ones ...")
    batches = sample_groups(sampler, cfg, rows, g, seed=seed)
    selection = select_passing(batches, criterion, sampler.rewards.max_values)
    log(
        f"kept {len(selection.demos)} distinct of {selection.passed}/{selection.sampled} "
        f"passing samples ({selection.criterion})"
    )
    if len(selection.demos) < min_kept:
        raise UserError(
            f"--from-rollouts: only {len(selection.demos)} distinct samples pass "
            f"({selection.passed}/{selection.sampled}, {selection.criterion}); at least "
            f"{min_kept} are needed (--min-kept). Sample more with --prompts/--generations, "
            "lower --threshold, or give demonstrations with --data. `grpokit preflight` "
            "shows the pass rate."
        )
    return selection
