"""The config's training prompts, a sampler over its model and rewards, and groups sampled as a
training step samples them.

Shared by ``grpokit preflight`` and ``grpokit sft --from-rollouts``: both must see the
completions training would see, so both sample through the config's
:class:`~grpokit.sampling.Sampler` (its sampling settings, system prompt and prompt truncation).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from grpokit.config import GRPOKitConfig, load_prompt_rows
from grpokit.data.prompts import PromptRow, check_columns
from grpokit.errors import UserError
from grpokit.progress import progress
from grpokit.rewards.compose import build_reward_set
from grpokit.rewards.registry import BuildContext
from grpokit.sampling.sampler import Sampler
from grpokit.sampling.scoring import ScoredBatch


def choose_prompts(rows: list[PromptRow], n: int, *, seed: int) -> list[PromptRow]:
    """n prompts drawn without replacement with a fixed seed (all of them when n >= len(rows)).

    The same seed gives the same prompts, so preflight before and after training compare alike.
    """
    if n < 1:
        raise UserError(f"--prompts must be >= 1, got {n}")
    if n >= len(rows):
        return list(rows)
    return random.Random(seed).sample(rows, n)


def open_sampler(
    cfg: GRPOKitConfig, *, checkpoint: Path | None = None, trainable: bool = False
) -> tuple[Sampler, list[PromptRow]]:
    """The config's training prompts and a sampler over its model and rewards.

    ``checkpoint`` replaces model.init_from; ``trainable`` loads the LoRA adapter of the config
    too (for SFT), otherwise the bare model (for sampling only). The caller closes
    ``sampler.rewards``.
    """
    rows = load_prompt_rows(cfg, "train")
    rewards = build_reward_set(
        cfg.rewards, BuildContext(base_dir=cfg.config_dir, run_dir=None, seed=cfg.training.seed)
    )
    try:
        check_columns(rows, rewards.required_columns, str(cfg.data.train))
        sampler = Sampler.from_config(cfg, rewards, checkpoint=checkpoint, trainable=trainable)
    except BaseException:
        rewards.close()
        raise
    return sampler, rows


def sample_groups(
    sampler: Sampler,
    cfg: GRPOKitConfig,
    rows: list[PromptRow],
    generations: int,
    *,
    seed: int,
    log: Callable[[str], None] | None = None,
) -> list[ScoredBatch]:
    """G completions for each row, scored; in chunks of the training step's prompt count, from
    one generator seeded with ``seed``. Progress goes to ``log`` (default stderr)."""
    if generations < 1:
        raise UserError(f"--generations must be >= 1, got {generations}")
    with progress("sampling prompts", len(rows), log=log) as bar:
        return list(
            sampler.chunks(
                rows,
                generations,
                prompts_per_chunk=cfg.training.completions_per_generation // generations,
                seed=seed,
                reseed_each_chunk=False,
                progress=bar,
            )
        )
