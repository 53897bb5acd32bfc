"""Setting up a GRPO run, one named step each: processes, policy, engine, optimizer, sinks.

The trainer calls these in order; each takes what it needs and returns what it builds, so the
set-up reads as a list and none of it hides in the training loop.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

import grpokit
from grpokit.config import GRPOKitConfig, TrainingConfig
from grpokit.core.losses import PolicyLoss
from grpokit.data.chat import prompts_past_context
from grpokit.data.prompts import PromptRow
from grpokit.errors import UserError
from grpokit.files import write_atomic, write_json
from grpokit.models.fp32_head import cast_lm_head_to_fp32
from grpokit.models.loading import Policy, model_context
from grpokit.models.onednn import store_frozen_linears_in_compute_dtype
from grpokit.monitor.sinks import JsonlSink, MetricsSink, TensorBoardSink
from grpokit.monitor.trackers import ReportBuilder, tracker_sinks
from grpokit.native.heuristics import reference_rows_pay
from grpokit.rollout.base import RolloutEngine
from grpokit.sampling import load_model_policy, torch_engine
from grpokit.train.distributed import DistContext, broadcast_parameters, shard_slice
from grpokit.train.fsdp import GatheredEngine, shard_policy


def with_process_count(cfg: GRPOKitConfig, dist: DistContext) -> GRPOKitConfig:
    """The config with ``training.num_processes`` set to the launcher's process count (a copy:
    the caller's config is left as it is). Each rank must get whole groups."""
    if not dist.enabled:
        return cfg
    try:
        training = TrainingConfig.model_validate(
            cfg.training.model_dump() | {"num_processes": dist.world_size}
        )
    except ValidationError as e:
        raise UserError(
            f"training with {dist.world_size} processes: {e.errors()[0]['msg']}"
        ) from None
    shard_slice(training.prompts_per_step, dist)
    out = cfg.model_copy(update={"training": training})
    out._config_dir, out._config_path = cfg.config_dir, cfg.config_path
    return out


def build_policy(
    cfg: GRPOKitConfig, *, device: torch.device, dist: DistContext, sharded: bool
) -> Policy:
    """The trainable policy (with its reference when beta > 0), identical on every rank, and
    sharded over the ranks under FSDP."""
    policy = load_model_policy(
        cfg.model,
        base_dir=cfg.config_dir,
        trainable=True,
        need_reference=cfg.training.beta > 0,
        # Under FSDP each unit moves to the device as it is sharded: the whole model need not fit.
        device=torch.device("cpu") if sharded else device,
    )
    broadcast_parameters(policy.model, dist)
    if cfg.training.cast_lm_head_to_fp32:
        for model in (policy.model, policy.reference):
            if model is not None:
                cast_lm_head_to_fp32(model)
    if sharded:
        # The frozen weights stay float32 here: the reference and LoRA's base are sharded with
        # the trained weights, and FSDP's units need one dtype.
        fc = cfg.training.fsdp_config
        shard_policy(
            policy,
            device,
            dist.world_size,
            reshard_after_forward=fc.reshard_after_forward,
            cpu_offload=fc.cpu_offload,
            layer_classes=fc.transformer_layer_cls_to_wrap,
        )
    else:
        if policy.reference is not None:
            store_frozen_linears_in_compute_dtype(policy.reference)
        policy.narrow_frozen_base()
    return policy


def build_engine(cfg: GRPOKitConfig, policy: Policy, *, sharded: bool) -> RolloutEngine:
    """torch generation over the policy's own weights (gathered whole under FSDP), or vLLM."""
    args = cfg.training
    if not args.use_vllm:
        # The reference rows read the policy's own frozen base: LoRA, and whole on this process.
        # Float32 only: there the engine's log-probs are the trainer's to rounding (tested); a
        # bfloat16 engine rounds elsewhere than the autocast forward does, which would leave a
        # KL of rounding noise between a policy and its unchanged base.
        reference = (
            args.ref_logprobs_in_rollout
            and args.beta > 0
            and policy.uses_adapter
            and policy.reference is None
            and policy.compute_dtype == torch.float32
            and reference_rows_pay(args.completions_per_generation // args.num_processes)
            and not sharded
            and not (cfg.tools or cfg.environment_factory)
        )
        local = torch_engine(
            policy,
            cfg.model.cpu_matmul,
            reference_logprobs=reference,
            keep_packed=not cfg.model.return_freed_memory,
        )
        return GatheredEngine(local, policy.model) if sharded else local
    from grpokit.hub.resolve import resolve_model_path
    from grpokit.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        policy.model,
        model_path=resolve_model_path(cfg.model.name_or_path),
        eos_token_ids=policy.eos_token_ids(),
        mode=args.vllm_mode,
        gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        max_model_len=(
            args.max_prompt_length + args.max_completion_length
            if args.max_prompt_length is not None
            else None
        ),
        max_num_seqs=-(-args.completions_per_generation // args.num_processes),  # one call's rows
        server_url=args.vllm_server_base_url,
        dtype=policy.compute_dtype,  # what the trainer computes in, not vLLM's reading of "auto"
        seed=args.seed,
        lora_sync=args.vllm_lora_sync,
        sleep_mode=args.vllm_enable_sleep_mode,
    )
    engine.sync_weights()  # vLLM loaded the base weights; the policy may be warm-started
    if args.max_staleness:
        from grpokit.rollout.ahead import AheadEngine

        return AheadEngine(engine)  # generates ahead, overlapping the update
    return engine


def build_loss(args: TrainingConfig) -> PolicyLoss:
    """The policy loss of ``loss_type`` with its settings; it tells the trainer what it needs."""
    # pi_old must be taken apart from pi_theta whenever one generation feeds several updates.
    return PolicyLoss(args.loss_settings, num_iterations=args.updates_per_round)


def total_steps(args: TrainingConfig, num_prompts: int) -> int:
    """Optimizer steps of the run: max_steps, or the epochs' generation rounds x the updates of
    each (mu x steps_per_generation / gradient_accumulation_steps)."""
    if args.max_steps > 0:
        return args.max_steps
    rounds = math.ceil(args.num_train_epochs * num_prompts / args.prompts_per_step)
    return max(1, rounds) * args.updates_per_round


def build_optimizer(
    args: TrainingConfig, parameters: list[torch.nn.Parameter], steps: int
) -> tuple[torch.optim.Optimizer, Any]:
    """The AdamW ``optim`` names over the trainable parameters, and the learning-rate schedule
    over ``steps``.

    adamw_torch_fused (TRL's default) runs one kernel over all parameters instead of a Python
    loop of small ops; bench/train_step.py measures the step it is part of.
    """
    from transformers import get_scheduler

    optimizer: torch.optim.Optimizer
    if args.adamw_8bit:
        import bitsandbytes

        optimizer = bitsandbytes.optim.AdamW8bit(parameters, **args.optimizer_kwargs)
    else:
        optimizer = torch.optim.AdamW(parameters, **args.optimizer_kwargs)
    warmup = args.warmup_steps or math.ceil(args.warmup_ratio * steps)
    scheduler = get_scheduler(
        args.lr_scheduler_type, optimizer, num_warmup_steps=warmup, num_training_steps=steps
    )
    return optimizer, scheduler


def versions() -> dict[str, str]:
    import peft
    import transformers

    return {
        "grpokit": grpokit.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "python": platform.python_version(),
    }


def write_run_files(cfg: GRPOKitConfig, run_dir: Path) -> None:
    """config.yaml (the resolved config), run.json (where relative paths resolve) and
    versions.json: what ``grpokit train RUN_DIR`` and a reader of the run need."""
    write_atomic(run_dir / "config.yaml", cfg.to_yaml())
    run_info = {
        "config_path": str(cfg.config_path) if cfg.config_path else None,
        "config_dir": str(cfg.config_dir),
    }
    write_json(run_dir / "run.json", run_info)
    write_json(run_dir / "versions.json", versions())


def open_sinks(
    cfg: GRPOKitConfig,
    run_dir: Path,
    *,
    resume_step: int | None,
    log: Callable[[str], None],
    build_report: ReportBuilder | None = None,
) -> list[MetricsSink]:
    """metrics.jsonl (cut back to ``resume_step`` on a resume), TensorBoard and the trackers
    ``report_to`` names; they upload the HTML report ``build_report`` writes (the command's, as
    the report sits above training), or none without it."""
    report_to = cfg.training.report_to
    sinks: list[MetricsSink] = [
        JsonlSink(run_dir / "metrics.jsonl", resume_from_step=resume_step or 0)
    ]
    if "tensorboard" in report_to:
        sinks.append(TensorBoardSink(run_dir / "tensorboard"))
    sinks.extend(
        tracker_sinks(
            report_to,
            run_dir=run_dir,
            config=cfg.model_dump(mode="json"),
            resume=resume_step is not None,
            log=log,
            build_report=build_report,
        )
    )
    return sinks


def fit_to_context(
    cfg: GRPOKitConfig,
    policy: Policy,
    rows: list[PromptRow],
    which: str,
    log: Callable[[str], None],
    *,
    tools: list[dict[str, Any]] | None = None,
) -> list[PromptRow]:
    """The prompts that leave room for max_completion_length in the model's context.

    With max_prompt_length, longer prompts are cut from the left to fit (the run checked that
    max_prompt_length does): how many is said. Without it, too-long prompts are refused with their
    lines (or dropped with data.drop_long_prompts), before a step tries to fit them.
    ``tools``: the JSON schemas the chat template writes into every prompt (the config's tools),
    counted as part of it.
    """
    a = cfg.training
    if not rows:
        return rows

    def longer_than(room: int) -> list[tuple[int, str]]:
        return prompts_past_context(
            policy.tokenizer,
            rows,
            room,
            system_prompt=cfg.system_prompt,
            chat_template_kwargs=a.chat_template_kwargs,
            tools=tools,
        )

    if a.max_prompt_length is not None:
        long = longer_than(a.max_prompt_length)
        if long:
            log(
                f"{len(long)} of {len(rows)} data.{which} prompts are longer than "
                f"training.max_prompt_length ({a.max_prompt_length} tokens) and are cut "
                f"from the left, e.g. {rows[long[0][0]].source} ({long[0][1]})"
            )
        return rows
    found = model_context(policy.model.config, policy.tokenizer)
    if found is None:
        return rows
    context, where = found
    room = context - a.max_completion_length
    long = longer_than(room)
    if not long:
        return rows
    what = (
        f"longer than the {room} tokens the model's context leaves ({context} tokens, "
        f"{where}, less training.max_completion_length {a.max_completion_length})"
    )
    if cfg.data.drop_long_prompts and len(long) < len(rows):
        log(f"dropped {len(long)} of {len(rows)} data.{which} prompts {what}")
        skip = {i for i, _ in long}
        return [r for i, r in enumerate(rows) if i not in skip]
    listed = ", ".join(f"{rows[i].source or f'row {i + 1}'} ({n})" for i, n in long[:10])
    more = f" and {len(long) - 10} more" if len(long) > 10 else ""
    fix = (
        "no prompt is left to train on"
        if cfg.data.drop_long_prompts
        else "shorten or remove them, set data.drop_long_prompts: true to drop them, or "
        "set training.max_prompt_length to cut them from the left"
    )
    raise UserError(
        f"data.{which}: {len(long)} of {len(rows)} prompts are {what}: {listed}{more}; {fix}"
    )
