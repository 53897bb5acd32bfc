"""One object that samples a configured policy and scores its completions.

A :class:`Sampler` holds the policy (model, tokenizer, pad and EOS ids), its rollout engine, the
sampling settings and prompt rendering of the config, and a reward set. Training, periodic
held-out checks, eval, generate, preflight and the demo all sample through it, so every command
renders prompts, samples and scores alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from grpokit.config import GRPOKitConfig, ModelConfig
from grpokit.data.chat import NO_TEMPLATE, apply_template_setting, encode_prompt
from grpokit.data.prompts import PromptRow
from grpokit.errors import UserError
from grpokit.hub.resolve import load_tokenizer
from grpokit.models.checkpoints import ModelSpec, model_dir
from grpokit.models.host_memory import FREED_BLOCKS_RETURNED_FROM, return_freed_blocks
from grpokit.models.loading import (
    LoraSettings,
    Policy,
    check_context_length,
    load_policy,
)
from grpokit.models.onednn import CpuMatmul
from grpokit.progress import Progress, progress
from grpokit.rewards.compose import RewardSet, part_pass_rates
from grpokit.rewards.sandbox.launcher import SandboxLimits
from grpokit.rollout.agent import (
    ToolMessageTokens,
    ToolRollout,
    check_tool_template,
    template_text,
    with_tools,
)
from grpokit.rollout.base import RolloutEngine, SamplingParams, without_reference_logprobs
from grpokit.rollout.environments import load_environments
from grpokit.rollout.tool_calls import (
    Parser,
    ToolCallFormat,
    detect_format,
    tool_call_parser,
)
from grpokit.rollout.tool_sandbox import sandboxed
from grpokit.rollout.tools import ToolCall, ToolRunner, load_tools
from grpokit.rollout.torch_engine import TorchEngine
from grpokit.sampling.runtime import resolve_device
from grpokit.sampling.scoring import (
    PassSummary,
    Sample,
    ScoredBatch,
    merge_scores,
    sample_and_score,
    summarize,
)


def load_model_policy(
    settings: ModelConfig,
    *,
    base_dir: Path,
    model: ModelSpec | None = None,
    checkpoint: Path | None = None,
    trainable: bool = False,
    need_reference: bool = False,
    device: torch.device | None = None,
) -> Policy:
    """The policy of a ``model:`` section.

    model: load these weights instead of the section's model (eval, generate), without LoRA.
    checkpoint: start from this checkpoint instead of ``init_from`` (preflight, SFT).
    trainable: add the section's LoRA adapter and gradient checkpointing (training, SFT); else
        the bare model, for sampling only.
    need_reference: keep the starting weights as the KL reference (beta > 0).
    device: where the model goes; default the section's ``device``.
    """
    name_or_path, init_from = settings.name_or_path, settings.init_from
    if model is not None:
        name_or_path, init_from = model.name_or_path, model.init_from
    elif checkpoint is not None:
        init_from = str(model_dir(checkpoint))
    elif init_from:
        init_from = str(_resolve(base_dir, init_from))
    lora = settings.lora if (trainable and model is None) else None
    device = device if device is not None else resolve_device(settings.device)
    if settings.return_freed_memory and device.type == "cpu":
        return_freed_blocks(FREED_BLOCKS_RETURNED_FROM)
    policy = load_policy(
        name_or_path,
        dtype=settings.dtype,
        lora=LoraSettings(**lora.model_dump()) if lora else None,
        gradient_checkpointing=settings.gradient_checkpointing and trainable,
        need_reference=need_reference,
        init_from=init_from,
        device=device,
        cpu_matmul=settings.cpu_matmul,
    )
    apply_template_setting(policy.tokenizer, settings.chat_template, base_dir)
    if not policy.tokenizer.chat_template:  # before any sampling: name the setting now
        raise UserError(NO_TEMPLATE.format(name=name_or_path))
    return policy


def _resolve(base_dir: Path, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else base_dir / p


def torch_engine(
    policy: Policy,
    cpu_matmul: CpuMatmul,
    *,
    reference_logprobs: bool = False,
    keep_packed: bool = True,
) -> TorchEngine:
    """The torch rollout engine over the policy's own weights; ``reference_logprobs``: score the
    sampled tokens under a LoRA policy's base too (see :class:`TorchEngine`)."""
    return TorchEngine(
        policy.model,
        eos_token_ids=policy.eos_token_ids(),
        pad_token_id=policy.pad_token_id,
        cpu_matmul=cpu_matmul,
        reference_logprobs=reference_logprobs,
        keep_packed=keep_packed,
    )


def tool_rollout(
    cfg: GRPOKitConfig, tokenizer: PreTrainedTokenizerBase, *, probe_row: PromptRow | None = None
) -> ToolRollout | None:
    """The multi-turn rollout with the config's ``tools:`` and ``environment_factory`` (None
    without either), for the policy's tokenizer with its chat template set. ``probe_row``: a
    training row the environment's ``reset`` is tried on.

    Raises:
        UserError: a tool or environment that does not load (naming its field), a chat template
            that cannot show tools or append their results, a tool-call format it cannot tell.
    """
    if not cfg.tools and not cfg.environment_factory:
        return None
    a = cfg.training
    specs = cfg.tool_specs
    tools = load_tools([s.function for s in specs], cfg.config_dir)
    for i, spec in enumerate(specs):
        if spec.sandbox:  # each call in a confined subprocess, the tool's file its program
            limits = SandboxLimits(timeout_s=a.tool_timeout, memory_mb=spec.memory_mb)
            tools[i] = sandboxed(tools[i], where=f"tools[{i}] {spec.function!r}", limits=limits)
    environments = None
    if cfg.environment_factory:
        row = None if probe_row is None else {"prompt": probe_row.prompt, **probe_row.columns}
        environments = load_environments(cfg.environment_factory, cfg.config_dir, probe_row=row)
        clash = {t.name for t in tools} & {t.name for t in environments.tools}
        if clash:
            raise UserError(
                f"environment_factory: its method(s) {', '.join(sorted(clash))} have the name "
                "of a tool in tools:; rename one"
            )
    schemas = [t.schema for t in tools]
    if environments is not None:
        schemas += [t.schema for t in environments.tools]
    parser: Parser = (
        _no_calls  # an environment without tool methods: one turn, reset and reward only
    )
    fmt: ToolCallFormat | None = None
    if schemas:
        fmt = _tool_call_format(cfg, tokenizer, schemas)
        parser = tool_call_parser(fmt, a.tool_call_regex)
    return ToolRollout(
        ToolRunner(tools, timeout=a.tool_timeout, max_result_chars=a.tool_max_result_chars),
        parser,
        ToolMessageTokens(tokenizer, schemas, a.chat_template_kwargs),
        a.max_tool_calling_iterations,
        environments,
        lenient=a.tool_call_lenient,
        format=fmt,
    )


def _no_calls(text: str) -> list[ToolCall]:
    return []


def _tool_call_format(
    cfg: GRPOKitConfig, tokenizer: PreTrainedTokenizerBase, schemas: list[dict[str, Any]]
) -> ToolCallFormat:
    """The configured format (auto: the chat template's), once the template is known to take
    tools."""
    a = cfg.training
    where = (
        "model.chat_template"
        if cfg.model.chat_template
        else f"the chat template of {cfg.model.name_or_path} (model.chat_template)"
    )
    eos = tokenizer.eos_token_id
    if eos is None:
        raise UserError(f"{cfg.model.name_or_path}: the tokenizer has no eos_token")
    check_tool_template(tokenizer, schemas, a.chat_template_kwargs, end_token=eos, where=where)
    fmt = a.tool_call_format
    if fmt == "auto":
        found = detect_format(template_text(tokenizer))
        if found is None:
            raise UserError(
                f"training.tool_call_format: auto cannot tell from {where} how the model writes "
                "tool calls; set hermes, llama3, or regex with training.tool_call_regex"
            )
        fmt = found
    return fmt


def check_tools(cfg: GRPOKitConfig, *, probe_row: PromptRow | None = None) -> None:
    """Check the config's tools and environment against its model's tokenizer before any model
    loads (the tokenizer alone loads in a moment): the same errors as :func:`tool_rollout`."""
    if not cfg.tools and not cfg.environment_factory:
        return
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    apply_template_setting(tokenizer, cfg.model.chat_template, cfg.config_dir)
    if not tokenizer.chat_template:
        raise UserError(NO_TEMPLATE.format(name=cfg.model.name_or_path))
    tool_rollout(cfg, tokenizer, probe_row=probe_row)


@dataclass
class Sampled:
    """The scored batches of one pass over a prompt list, in prompt order."""

    batches: list[ScoredBatch]
    max_values: list[float | None]

    def samples(self, model: str) -> list[Sample]:
        """Every completion as a :class:`Sample` labelled ``model``, prompts numbered in order."""
        out: list[Sample] = []
        first = 0
        for batch in self.batches:
            out += batch.samples(model, first_prompt=first)
            first += len(batch.rows)
        return out

    def summary(self) -> list[PassSummary]:
        """Per reward: the mean and the passes (at the reward's maximum) over all samples."""
        return summarize(merge_scores([b.scores for b in self.batches]), self.max_values)

    def part_pass_rates(self) -> dict[str, float]:
        """``<part>/pass_rate`` over all samples for each reward part (a checklist's items)."""
        return part_pass_rates(merge_scores([b.scores for b in self.batches]).parts)

    def passes(self, reward: int) -> list[list[bool]]:
        """Per prompt, whether each sample reached the maximum of reward number ``reward``
        (samples where it did not apply are left out)."""
        top = self.max_values[reward]
        if top is None:
            raise ValueError("this reward has no maximum, so no pass / fail")
        out = []
        for batch in self.batches:
            column = batch.scores.per_function[:, reward]
            g = batch.group_size
            for i in range(len(batch.rows)):
                values = column[i * g : (i + 1) * g]
                out.append([bool(v >= top - 1e-9) for v in values if not torch.isnan(v)])
        return out

    def per_prompt(self, reward: int | None = None) -> list[list[float]]:
        """Per prompt, the scores of its samples under reward number ``reward`` (None: the
        weighted total), NaN (not applicable) included: the clusters of a standard error."""
        out = []
        for batch in self.batches:
            scores = batch.scores
            column = scores.total if reward is None else scores.per_function[:, reward]
            g = batch.group_size
            out += [column[i * g : (i + 1) * g].tolist() for i in range(len(batch.rows))]
        return out


@dataclass
class Sampler:
    """A policy ready to sample: its engine, the config's sampling and prompt rendering, rewards.

    The reward set is not owned: whoever built it closes it (eval scores several models with one
    set).
    """

    policy: Policy
    engine: RolloutEngine
    rewards: RewardSet
    sampling: SamplingParams
    system_prompt: str | None
    max_prompt_length: int | None
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra variables of the chat template (TRL's chat_template_kwargs, e.g. enable_thinking)."""
    tools: ToolRollout | None = None
    """Multi-turn rollouts with tools (the config's ``tools:``); None samples one turn."""

    @classmethod
    def load(
        cls,
        settings: ModelConfig,
        rewards: RewardSet,
        *,
        sampling: SamplingParams,
        system_prompt: str | None,
        max_prompt_length: int | None,
        base_dir: Path,
        chat_template_kwargs: dict[str, Any] | None = None,
        model: ModelSpec | None = None,
        checkpoint: Path | None = None,
        trainable: bool = False,
        device: torch.device | None = None,
    ) -> Sampler:
        """Load the policy of a ``model:`` section (see :func:`load_model_policy`) with a torch
        engine over its weights."""
        check_context_length(
            model.name_or_path if model is not None else settings.name_or_path,
            max_prompt_length=max_prompt_length,
            max_completion_length=sampling.max_completion_length,
        )
        policy = load_model_policy(
            settings,
            base_dir=base_dir,
            model=model,
            checkpoint=checkpoint,
            trainable=trainable,
            device=device,
        )
        if not trainable:
            policy.model.eval()
        engine = torch_engine(
            policy, settings.cpu_matmul, keep_packed=not settings.return_freed_memory
        )
        return cls(
            policy,
            engine,
            rewards,
            sampling,
            system_prompt,
            max_prompt_length,
            chat_template_kwargs,
        )

    @classmethod
    def from_config(
        cls,
        cfg: GRPOKitConfig,
        rewards: RewardSet,
        *,
        model: ModelSpec | None = None,
        checkpoint: Path | None = None,
        trainable: bool = False,
        device: torch.device | None = None,
    ) -> Sampler:
        """The config's policy with its sampling settings, prompt rendering and tools."""
        check_tools(cfg)  # before the model loads
        sampler = cls.load(
            cfg.model,
            rewards,
            sampling=cfg.training.sampling_params,
            system_prompt=cfg.system_prompt,
            max_prompt_length=cfg.training.max_prompt_length,
            base_dir=cfg.config_dir,
            chat_template_kwargs=cfg.training.chat_template_kwargs,
            model=model,
            checkpoint=checkpoint,
            trainable=trainable,
            device=device,
        )
        sampler.tools = tool_rollout(cfg, sampler.tokenizer)
        return sampler

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.policy.tokenizer

    @property
    def rollout_engine(self) -> RolloutEngine:
        """What completions come from: ``engine``, whose turns a tool engine strings together
        where there are ``tools``."""
        return with_tools(self.engine, self.tools)

    def prefetch(self, rows: list[PromptRow], num_generations: int) -> None:
        """Hand the rows' prompts to an engine that generates ahead (grpokit.rollout.ahead), so
        that a later :meth:`sample` of the same rows finds its generation under way. Other
        engines, and multi-turn rollouts (a turn's prompt depends on the last), skip it."""
        if not self.rollout_engine.capabilities.prefetch:
            return
        prompt_ids = [
            encode_prompt(
                self.policy.tokenizer,
                row.prompt,
                system_prompt=self.system_prompt,
                max_prompt_length=self.max_prompt_length,
                chat_template_kwargs=self.chat_template_kwargs,
            )
            for row in rows
        ]
        self.engine.prefetch(prompt_ids, num_generations, self.sampling)

    def sample(
        self, rows: list[PromptRow], num_generations: int, *, generator: torch.Generator | None
    ) -> ScoredBatch:
        """``num_generations`` scored completions for each row, group-major."""
        return sample_and_score(
            self.rollout_engine,
            self.policy.tokenizer,
            rows,
            self.rewards,
            num_generations=num_generations,
            sampling=self.sampling,
            system_prompt=self.system_prompt,
            max_prompt_length=self.max_prompt_length,
            generator=generator,
            chat_template_kwargs=self.chat_template_kwargs,
        )

    def chunks(
        self,
        rows: list[PromptRow],
        num_generations: int,
        *,
        prompts_per_chunk: int,
        seed: int,
        reseed_each_chunk: bool,
        progress: Progress | None = None,
    ) -> Iterator[ScoredBatch]:
        """The rows in chunks of ``prompts_per_chunk`` prompts, each sampled and scored.

        reseed_each_chunk: chunk c draws from a generator seeded with ``seed + c``, so that every
        model compared on the same prompts gets the same randomness (eval, generate); otherwise
        one generator seeded with ``seed`` runs through all chunks (preflight).
        ``progress`` advances by each chunk's prompts.
        """
        per_chunk = max(1, prompts_per_chunk)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad(), without_reference_logprobs(self.engine):
            for c, start in enumerate(range(0, len(rows), per_chunk)):
                if reseed_each_chunk:
                    generator = torch.Generator().manual_seed(seed + c)
                chunk = rows[start : start + per_chunk]
                yield self.sample(chunk, num_generations, generator=generator)
                if progress is not None:
                    progress.advance(len(chunk))

    def score_prompts(
        self,
        rows: list[PromptRow],
        samples: int,
        *,
        seed: int,
        prompts_per_chunk: int | None = None,
        progress: Progress | None = None,
    ) -> Sampled:
        """The held-out check: ``samples`` completions of every row with fixed seeds, scored.

        Without ``prompts_per_chunk`` all rows are sampled at once from one generator seeded
        with ``seed``; with it, chunk c of every model is sampled with ``seed + c``.
        """
        if prompts_per_chunk is None:
            with torch.no_grad(), without_reference_logprobs(self.engine):
                batches = [
                    self.sample(rows, samples, generator=torch.Generator().manual_seed(seed))
                ]
        else:
            batches = list(
                self.chunks(
                    rows,
                    samples,
                    prompts_per_chunk=prompts_per_chunk,
                    seed=seed,
                    reseed_each_chunk=True,
                    progress=progress,
                )
            )
        return Sampled(batches, list(self.rewards.max_values))

    def model_samples(
        self,
        label: str,
        rows: list[PromptRow],
        samples: int,
        *,
        seed: int,
        batch_size: int,
        log: Callable[[str], None] | None = None,
    ) -> list[Sample]:
        """``samples`` scored completions of every row for the comparison tables of eval and
        generate, labelled ``label``: chunks of ``batch_size`` completions, chunk c drawn with
        ``seed + c`` for every model (same randomness, different weights), with progress."""
        with progress(label, len(rows), log=log) as bar:
            scored = self.score_prompts(
                rows,
                samples,
                seed=seed,
                prompts_per_chunk=max(1, batch_size // samples),
                progress=bar,
            )
        return scored.samples(label)
