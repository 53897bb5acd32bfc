"""Loading the configured model, rewards and prompts, and sampling as a training step does.

Shared by ``grpokit preflight`` and ``grpokit sft --from-rollouts``: both must see the
completions training would see, so both go through ``sample_and_score`` with the config's
sampling settings, system prompt and prompt truncation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from grpokit.config import GRPOKitConfig
from grpokit.data.prompts import PromptRow, check_columns, load_prompts
from grpokit.errors import UserError
from grpokit.models.loading import Policy, load_policy
from grpokit.preflight.measure import RewardInfo, SamplingSettings
from grpokit.rewards.compose import RewardSet, build_reward_set
from grpokit.rewards.registry import BuildContext
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.torch_engine import TorchEngine
from grpokit.train.scoring import ScoredBatch, sample_and_score
from grpokit.train.trainer import resolve_device

_TAGGED_TYPES = ("xml_format", "tags_present")


def reward_infos(cfg: GRPOKitConfig, rewards: RewardSet) -> list[RewardInfo]:
    """The verdict's view of the configured rewards, in config order."""
    out = []
    for spec, max_value in zip(cfg.rewards, rewards.max_values, strict=True):
        tags = getattr(spec.params, "tags", None) if spec.type in _TAGGED_TYPES else None
        out.append(
            RewardInfo(
                name=spec.display_name,
                type=spec.type,
                weight=spec.weight,
                max_value=max_value,
                tags=tuple(tags) if tags else None,
                gate=spec.gate.reward if spec.gate else None,
            )
        )
    return out


def resolve_checkpoint(path: Path) -> Path:
    """The model directory of a checkpoint: ``checkpoint-N/model`` for a training checkpoint,
    the directory itself for an SFT output or any saved model."""
    path = path.expanduser()
    if not path.is_dir():
        raise UserError(f"--checkpoint {path}: no such directory")
    inner = path / "model"
    if inner.is_dir() and (
        (inner / "config.json").is_file() or (inner / "adapter_config.json").is_file()
    ):
        return inner
    if (path / "config.json").is_file() or (path / "adapter_config.json").is_file():
        return path
    raise UserError(
        f"--checkpoint {path}: holds no model (no config.json or adapter_config.json, and no "
        "model/ subdirectory); give a training checkpoint-N directory or an SFT output directory"
    )


def choose_prompts(rows: list[PromptRow], n: int, *, seed: int) -> list[PromptRow]:
    """n prompts drawn without replacement with a fixed seed (all of them when n >= len(rows)).

    The same seed gives the same prompts, so preflight before and after training compare alike.
    """
    if n < 1:
        raise UserError(f"--prompts must be >= 1, got {n}")
    if n >= len(rows):
        return list(rows)
    return random.Random(seed).sample(rows, n)


@dataclass
class Sampler:
    """The configured policy, rewards and prompts, ready to sample groups from."""

    cfg: GRPOKitConfig
    policy: Policy
    engine: TorchEngine
    rewards: RewardSet
    rows: list[PromptRow]
    sampling: SamplingParams
    system_prompt: str | None
    init_from: str | None

    def sample(self, rows: list[PromptRow], generations: int, *, seed: int) -> list[ScoredBatch]:
        """G completions for each row, scored; in chunks of the training step's prompt count."""
        if generations < 1:
            raise UserError(f"--generations must be >= 1, got {generations}")
        chunk = max(1, self.cfg.training.generation_batch_size // generations)
        generator = torch.Generator().manual_seed(seed)
        return [
            sample_and_score(
                self.engine,
                self.policy.tokenizer,
                rows[i : i + chunk],
                self.rewards,
                num_generations=generations,
                sampling=self.sampling,
                system_prompt=self.system_prompt,
                max_prompt_length=self.cfg.training.max_prompt_length,
                generator=generator,
            )
            for i in range(0, len(rows), chunk)
        ]

    def settings(self, prompts: int, generations: int, seed: int) -> SamplingSettings:
        t = self.cfg.training
        return SamplingSettings(
            prompts=prompts,
            generations=generations,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            top_k=self.sampling.top_k,
            max_completion_length=self.sampling.max_completion_length,
            beta=t.beta,
            scale_rewards=t.scale_rewards,
            system_prompt=self.system_prompt,
            seed=seed,
        )

    def close(self) -> None:
        self.rewards.close()


def open_sampler(
    cfg: GRPOKitConfig, *, checkpoint: Path | None = None, trainable: bool = False
) -> Sampler:
    """Load what sampling needs. ``checkpoint`` replaces model.init_from; ``trainable`` loads
    the LoRA adapter of the config too (for SFT), otherwise the bare model (for sampling only)."""
    from grpokit.models.loading import LoraSettings

    rows = load_prompts(cfg.resolve(cfg.data.train), prompt_column=cfg.data.prompt_column)
    system_prompt = cfg.system_prompt
    rewards = build_reward_set(
        cfg.rewards, BuildContext(base_dir=cfg.config_dir, run_dir=None, seed=cfg.training.seed)
    )
    try:
        check_columns(rows, rewards.required_columns, str(cfg.data.train))
        m = cfg.model
        if checkpoint is not None:
            init_from: str | None = str(resolve_checkpoint(checkpoint))
        else:
            init_from = str(cfg.resolve(m.init_from)) if m.init_from else None
        lora = LoraSettings(**m.lora.model_dump()) if (m.lora and trainable) else None
        policy = load_policy(
            m.name_or_path,
            dtype=m.dtype,
            lora=lora,
            gradient_checkpointing=m.gradient_checkpointing and trainable,
            need_reference=False,
            init_from=init_from,
            device=resolve_device(m.device),
        )
        tok = policy.tokenizer
        pad = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        engine = TorchEngine(policy.model, eos_token_ids=policy.eos_token_ids(), pad_token_id=pad)
    except BaseException:
        rewards.close()
        raise
    t = cfg.training
    sampling = SamplingParams(
        max_completion_length=t.max_completion_length,
        temperature=t.temperature,
        top_p=t.top_p,
        top_k=t.top_k or 0,
    )
    return Sampler(cfg, policy, engine, rewards, rows, sampling, system_prompt, init_from)
