"""The GRPO training loop: rollout -> reward -> advantage -> update -> log, in one readable place.

`GRPOTrainer.step()` is the whole algorithm of one optimizer step (or num_iterations of them);
everything else in this file is set-up, bookkeeping and checkpoints.
"""

from __future__ import annotations

import json
import math
import platform
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import grpokit
from grpokit.config import GRPOKitConfig
from grpokit.core.advantages import compute_advantages, reward_zero_std_mask
from grpokit.core.losses import policy_loss
from grpokit.data.prompts import PromptRow, check_columns, load_prompts
from grpokit.errors import UserError
from grpokit.models.loading import LoraSettings, Policy, load_policy
from grpokit.monitor import MonitorSet
from grpokit.monitor.sinks import JsonlSink, MetricsSink, TensorBoardSink
from grpokit.monitor.trackers import missing_tracker_packages, tracker_sinks
from grpokit.rewards.compose import RewardSet, build_reward_set
from grpokit.rewards.registry import BuildContext
from grpokit.rollout.base import RolloutEngine, SamplingParams
from grpokit.rollout.torch_engine import TorchEngine
from grpokit.train.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from grpokit.train.console import interrupt_guard, progress_bar
from grpokit.train.data_order import PromptStream
from grpokit.train.distributed import (
    all_reduce_gradients,
    all_reduce_scalars,
    barrier,
    broadcast_parameters,
    gather_rows,
    init_distributed,
    reduce_metrics,
    shard_slice,
)
from grpokit.train.experience import Experience
from grpokit.train.forward import TokenBatch, completion_logprobs
from grpokit.train.fsdp import (
    GatheredEngine,
    full_state,
    gathered,
    idle_pass,
    missing_micro_batches,
    shard_policy,
)
from grpokit.train.scoring import ScoredBatch, sample_and_score, summarize
from grpokit.train.step_metrics import (
    completion_records,
    forecast_metrics,
    loss_metrics,
    rollout_metrics,
)


@dataclass
class TrainResult:
    run_dir: Path
    global_step: int
    checkpoint: Path | None
    history: list[dict[str, Any]] = field(default_factory=list)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


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


_STEP_NORMALISED = ("dapo", "dr_grpo")


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


class GRPOTrainer:
    """Trains `cfg.model` on `cfg.data.train` with `cfg.rewards`; writes everything to run_dir."""

    def __init__(
        self,
        cfg: GRPOKitConfig,
        *,
        run_dir: Path | None = None,
        resume: bool = False,
        progress: bool = True,
        log: Callable[[str], None] = print,
    ) -> None:
        self.cfg = cfg
        self.args = cfg.training
        self.run_dir = (run_dir or cfg.output_dir).resolve()
        self.log = log
        self.show_progress = progress
        seed_everything(self.args.seed)
        self.dist, self.device = init_distributed(resolve_device(cfg.model.device))
        if self.dist.enabled:
            self._join_processes()
        # Sharding over one process would save nothing, so the same config runs on a laptop.
        self.sharded = self.args.fsdp and self.dist.enabled
        if self.args.fsdp and not self.dist.enabled:
            self.log(
                "training.fsdp: a single process holds the whole model; FSDP needs 2+ processes"
            )

        # Data and rewards first: their errors are cheap to find and must come before model loading.
        self.rows = load_prompts(cfg.resolve(cfg.data.train), prompt_column=cfg.data.prompt_column)
        self.heldout: list[PromptRow] = []
        if cfg.data.heldout:
            self.heldout = load_prompts(
                cfg.resolve(cfg.data.heldout), prompt_column=cfg.data.prompt_column
            )
        self.system_prompt = cfg.system_prompt
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rewards: RewardSet = build_reward_set(
            cfg.rewards,
            BuildContext(base_dir=cfg.config_dir, run_dir=self.run_dir, seed=self.args.seed),
        )
        check_columns(self.rows, self.rewards.required_columns, str(cfg.data.train))
        if self.heldout:
            check_columns(self.heldout, self.rewards.required_columns, str(cfg.data.heldout))
        missing_tracker_packages(self.args.report_to)  # before the slow model load

        m = cfg.model
        lora = LoraSettings(**m.lora.model_dump()) if m.lora else None
        init_from = str(cfg.resolve(m.init_from)) if m.init_from else None
        self.policy: Policy = load_policy(
            m.name_or_path,
            dtype=m.dtype,
            lora=lora,
            gradient_checkpointing=m.gradient_checkpointing,
            need_reference=self.args.beta > 0,
            init_from=init_from,
            # Under FSDP each unit moves to the device as it is sharded: the whole model need not fit.
            device=torch.device("cpu") if self.sharded else self.device,
            cpu_matmul=m.cpu_matmul,
        )
        tok = self.policy.tokenizer
        self.pad_token_id = int(
            tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        )
        broadcast_parameters(self.policy.model, self.dist)
        if self.sharded:
            fc = self.args.fsdp_config
            shard_policy(
                self.policy,
                self.device,
                self.dist.world_size,
                reshard_after_forward=fc.reshard_after_forward,
                cpu_offload=fc.cpu_offload,
                layer_classes=fc.transformer_layer_cls_to_wrap,
            )
        self.engine: RolloutEngine = self._build_engine()
        self.sampling = SamplingParams(
            max_completion_length=self.args.max_completion_length,
            temperature=self.args.temperature,
            top_p=self.args.top_p,
            top_k=self.args.top_k or 0,
        )
        # Ranks sample different completions; rank 0 draws what a single process would.
        self.generator = torch.Generator().manual_seed(self._rank_seed(0))

        self.total_steps = self._total_steps()
        self.optimizer = torch.optim.AdamW(
            self.policy.trainable_parameters(),
            lr=self.args.learning_rate,
            betas=(self.args.adam_beta1, self.args.adam_beta2),
            eps=self.args.adam_epsilon,
            weight_decay=self.args.weight_decay,
            # One kernel over all parameters instead of a Python loop of small ops (also
            # transformers' default): on the embedded model's 135M parameters on CPU, 64 ms
            # against 291 ms a step.
            fused=True,
        )
        from transformers import get_scheduler

        warmup = self.args.warmup_steps or math.ceil(self.args.warmup_ratio * self.total_steps)
        self.scheduler = get_scheduler(
            self.args.lr_scheduler_type,
            self.optimizer,
            num_warmup_steps=warmup,
            num_training_steps=self.total_steps,
        )
        self.stream = PromptStream(self.rows, seed=self.args.seed, shuffle=cfg.data.shuffle)
        self.state = TrainerState()
        if resume:
            ckpt = latest_checkpoint(self.run_dir)
            self.state = load_checkpoint(
                ckpt,
                policy=self.policy,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                generator=self.generator,
                sharded=self.sharded,
            )
            self.stream.seek(self.state.epoch, self.state.position)
            if self.dist.rank:  # the checkpoint holds rank 0's generator
                self.generator.manual_seed(self._rank_seed(self.state.generation_round))
            self.log(f"resumed from {ckpt} at step {self.state.global_step}")
        self.sinks: list[MetricsSink] = []
        if self.dist.is_main:  # one writer per run directory
            self._write_run_files()
            self.sinks.append(
                JsonlSink(
                    self.run_dir / "metrics.jsonl",
                    resume_from_step=self.state.global_step if resume else 0,
                )
            )
            if "tensorboard" in self.args.report_to:
                self.sinks.append(TensorBoardSink(self.run_dir / "tensorboard"))
            self.sinks.extend(
                tracker_sinks(
                    self.args.report_to,
                    run_dir=self.run_dir,
                    config=cfg.model_dump(mode="json"),
                    resume=resume,
                    log=self.log,
                )
            )
        self.monitors = MonitorSet(
            cfg.monitors,
            self.rewards.names,
            {
                n: m
                for n, m in zip(self.rewards.names, self.rewards.max_values, strict=False)
                if m is not None
            },
        )
        self.history: list[dict[str, Any]] = []

    # ---- set-up helpers ------------------------------------------------------------------------

    def _join_processes(self) -> None:
        """Data-parallel set-up (see grpokit.train.distributed): the launcher's process count sets
        training.num_processes, each rank must get whole groups, and only rank 0 talks."""
        from pydantic import ValidationError

        try:
            self.args.num_processes = self.dist.world_size
        except ValidationError as e:
            raise UserError(
                f"training with {self.dist.world_size} processes: {e.errors()[0]['msg']}"
            ) from None
        shard_slice(self.args.prompts_per_step, self.dist)
        if not self.dist.is_main:
            self.log = lambda message: None
            self.show_progress = False

    def _build_engine(self) -> RolloutEngine:
        if not self.args.use_vllm:
            local = TorchEngine(
                self.policy.model,
                eos_token_ids=self.policy.eos_token_ids(),
                pad_token_id=self.pad_token_id,
                cpu_matmul=self.cfg.model.cpu_matmul,
            )
            return GatheredEngine(local, self.policy.model) if self.sharded else local
        from grpokit.models.loading import resolve_model_path
        from grpokit.rollout.vllm_engine import VLLMEngine

        a = self.args
        engine = VLLMEngine(
            self.policy.model,
            model_path=resolve_model_path(self.cfg.model.name_or_path),
            eos_token_ids=self.policy.eos_token_ids(),
            mode=a.vllm_mode,
            gpu_memory_utilization=a.vllm_gpu_memory_utilization,
            server_url=a.vllm_server_base_url,
            dtype=self.cfg.model.dtype,
            seed=a.seed,
        )
        engine.sync_weights()  # vLLM loaded the base weights; the policy may be warm-started
        return engine

    def _rank_seed(self, offset: int) -> int:
        return self.args.seed + 1_000_003 * self.dist.rank + offset

    def _local_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """Advantages (n,) of this rank's rewards (n,), computed over the global batch so that
        scale_rewards: batch uses the global std (ranks hold equal shares)."""
        a = self.args
        everyone = gather_rows(rewards, self.dist)
        advantages = compute_advantages(
            everyone, a.num_generations, estimator=a.advantage_estimator, scale=a.scale_rewards
        )
        n = rewards.shape[0]
        return advantages[self.dist.rank * n : (self.dist.rank + 1) * n]

    def _total_steps(self) -> int:
        if self.args.max_steps > 0:
            return self.args.max_steps
        rounds = math.ceil(self.args.num_train_epochs * len(self.rows) / self.args.prompts_per_step)
        return max(1, rounds) * self.args.num_iterations

    def _write_run_files(self) -> None:
        (self.run_dir / "config.yaml").write_text(self.cfg.to_yaml(), encoding="utf-8")
        run_info = {
            "config_path": str(self.cfg.config_path) if self.cfg.config_path else None,
            "config_dir": str(self.cfg.config_dir),
        }
        (self.run_dir / "run.json").write_text(json.dumps(run_info, indent=2))
        (self.run_dir / "versions.json").write_text(json.dumps(versions(), indent=2))

    # ---- the algorithm -------------------------------------------------------------------------

    def collect(
        self,
    ) -> tuple[Experience | None, ScoredBatch, torch.Tensor, dict[str, float]]:
        """Rollout and reward: G completions for each of the step's prompts, and advantages.

        With dynamic_sampling, groups whose rewards are all equal (no signal) are dropped and more
        prompts are sampled, up to max_dynamic_sampling_rounds generation rounds.
        """
        a = self.args
        want_groups = a.prompts_per_step
        kept: list[tuple[ScoredBatch, torch.Tensor, torch.Tensor]] = []
        first: tuple[ScoredBatch, torch.Tensor] | None = None
        timings = {"time/generate": 0.0, "time/score": 0.0}
        n_groups = 0
        rounds = a.max_dynamic_sampling_rounds if a.dynamic_sampling else 1
        for _ in range(rounds):
            need = want_groups - n_groups if a.dynamic_sampling else want_groups
            world = self.dist.world_size
            # Every rank takes the same global rows (same order) and keeps its share of groups.
            rows = self.stream.take(-(-need // world) * world)
            rows = rows[shard_slice(len(rows), self.dist)]
            scored = sample_and_score(
                self.engine,
                self.policy.tokenizer,
                rows,
                self.rewards,
                num_generations=a.num_generations,
                sampling=self.sampling,
                system_prompt=self.system_prompt,
                max_prompt_length=a.max_prompt_length,
                generator=self.generator,
            )
            self.state.generation_round += 1
            timings["time/generate"] += scored.generate_seconds
            timings["time/score"] += scored.score_seconds
            advantages = self._local_advantages(scored.scores.total)
            first = first or (scored, advantages)
            keep = torch.ones(len(rows), dtype=torch.bool)
            if a.dynamic_sampling:
                keep = ~reward_zero_std_mask(scored.scores.total, a.num_generations)
            kept.append((scored, advantages, keep))
            n_groups += int(all_reduce_scalars([float(keep.sum())], self.dist)[0])
            if n_groups >= want_groups:
                break
        assert first is not None
        # The first round's batch (and its advantages, exactly as trained on) is what the step
        # reports and logs; later dynamic-sampling rounds only top up the groups with signal.
        return self._experience(kept), *first, timings

    def _experience(
        self, kept: list[tuple[ScoredBatch, torch.Tensor, torch.Tensor]]
    ) -> Experience | None:
        g = self.args.num_generations
        prompt_ids: list[list[int]] = []
        completion_ids: list[list[int]] = []
        adv: list[torch.Tensor] = []
        rows_mask: list[float] = []
        for scored, advantages, keep in kept:
            expanded = scored.expanded_prompt_ids()
            for i in range(len(scored.rows)):
                if not keep[i]:
                    continue
                for j in range(i * g, (i + 1) * g):
                    prompt_ids.append(expanded[j])
                    completion_ids.append(scored.rollout.completion_ids[j])
                    truncated = scored.rollout.finish_reason[j] == "length"
                    rows_mask.append(
                        0.0 if (truncated and self.args.mask_truncated_completions) else 1.0
                    )
                adv.append(advantages[i * g : (i + 1) * g])
        if not completion_ids:
            return None
        return Experience(prompt_ids, completion_ids, torch.cat(adv), torch.tensor(rows_mask))

    def _per_token_reference(
        self, exp: Experience, micro_batches: list[slice], idle: int = 0
    ) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        """Log-probs that stay fixed during the update: pi_old (mu > 1 only), pi_ref (beta > 0 only).

        ``idle``: forwards without rows to run after the real ones (FSDP, see fsdp.idle_pass).
        """
        a = self.args
        old: list[torch.Tensor | None] = [None] * len(micro_batches)
        ref: list[torch.Tensor | None] = [None] * len(micro_batches)
        if a.num_iterations == 1 and a.beta == 0:
            return old, ref
        model = self.policy.model
        with torch.no_grad():
            for k, rows in enumerate(micro_batches):
                batch = exp.micro_batch(rows, self.pad_token_id).to(self.device)
                if a.num_iterations > 1:
                    old[k] = self._logprobs(model, batch)[0]
                if a.beta > 0:
                    with self.policy.reference_model() as ref_model:
                        ref[k] = self._logprobs(ref_model, batch)[0]
            for _ in range(idle):
                if a.num_iterations > 1:
                    idle_pass(model, self.pad_token_id, self.device, backward=False)
                if a.beta > 0:
                    with self.policy.reference_model() as ref_model:
                        idle_pass(ref_model, self.pad_token_id, self.device, backward=False)
        return old, ref

    def _logprobs(
        self, model: torch.nn.Module, batch: TokenBatch, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # Encoding each prompt once takes one forward more where a micro-batch shares prompts;
        # under FSDP every forward is a collective, so all ranks must run the same number. Keyed
        # on the config, not on the process count, so that one process computes exactly what the
        # same YAML computes sharded.
        return completion_logprobs(
            model,
            batch,
            temperature=self.args.temperature,
            with_entropy=with_entropy,
            share_prompts=not self.args.fsdp,
        )

    def update(self, exp: Experience) -> list[dict[str, float]]:
        """num_iterations optimizer steps on one experience batch; metrics of each."""
        a = self.args
        micro_batches = exp.micro_batch_rows(
            a.per_device_train_batch_size, a.max_tokens_per_micro_batch
        )
        # Under FSDP every forward and backward is a collective: all ranks run as many micro-batches.
        idle = missing_micro_batches(len(micro_batches), self.dist) if self.sharded else 0
        old_logps, ref_logps = self._per_token_reference(exp, micro_batches, idle)
        # Global counts: each rank's loss is then its share of the global loss (grads are summed).
        active, num_rows = all_reduce_scalars([exp.active_tokens(), len(exp)], self.dist)
        num_active, num_rows = max(1, int(active)), max(1, int(num_rows))
        step_metrics = []
        model = self.policy.model
        model.train()
        for _ in range(a.num_iterations):
            sums: dict[str, float] = {}
            tokens_seen = 0.0
            entropies: list[float] = []
            for k, rows in enumerate(micro_batches):
                batch = exp.micro_batch(rows, self.pad_token_id).to(self.device)
                mask = batch.completion_mask * exp.loss_mask_rows[rows].to(self.device)[:, None]
                logp, entropy = self._logprobs(model, batch, with_entropy=True)
                old = old_logps[k] if old_logps[k] is not None else logp.detach()
                out = policy_loss(
                    logp,
                    old,
                    exp.advantages[rows].to(self.device),
                    mask,
                    loss_type=a.loss_type,
                    epsilon_low=a.epsilon,
                    epsilon_high=a.epsilon_high,
                    beta=a.beta,
                    ref_logp=ref_logps[k],
                    importance_sampling_level=a.importance_sampling_level,
                    max_completion_length=a.max_completion_length,
                    num_active_tokens=num_active,
                    num_sequences=num_rows,
                    delta=a.delta,
                )
                # dapo and dr_grpo are normalised by step-wide counts already; grpo and bnpo are
                # means over their micro-batch, so weight them by its share of the rows.
                weight = (
                    1.0 if a.loss_type in _STEP_NORMALISED else (rows.stop - rows.start) / num_rows
                )
                (out.loss * weight).backward()
                n_tok = float(mask.sum().item())
                tokens_seen += n_tok
                sums["loss"] = sums.get("loss", 0.0) + float(out.loss.item()) * weight
                for key, value in loss_metrics(out).items():
                    sums[key] = sums.get(key, 0.0) + value * n_tok
                if entropy is not None and n_tok > 0:
                    entropies.append(float((entropy * mask).sum().item() / n_tok))
            for _ in range(idle):
                idle_pass(model, self.pad_token_id, self.device, backward=True)
            if not self.sharded:  # FSDP reduce-scattered the gradients in backward
                all_reduce_gradients(self.policy.trainable_parameters(), self.dist)
            grad_norm = torch.nn.utils.clip_grad_norm_(
                self.policy.trainable_parameters(), a.max_grad_norm
            )
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            metrics = {"loss": sums.pop("loss", 0.0), "grad_norm": float(grad_norm)}
            for key, value in sums.items():
                metrics[key] = value / max(tokens_seen, 1.0)
            metrics["entropy"] = _mean(entropies)
            step_metrics.append(reduce_metrics(metrics, self.dist, weight=tokens_seen))
        return step_metrics

    def step(self) -> list[dict[str, Any]]:
        """One generation round and its num_iterations optimizer steps; returns their metrics."""
        t0 = time.perf_counter()
        exp, scored, advantages, timings = self.collect()
        t1 = time.perf_counter()
        shared = self._rollout_metrics(scored) | timings
        if self.dist.enabled:
            anyone = all_reduce_scalars([float(exp is not None)], self.dist, "max")[0]
            if exp is None and anyone:  # others kept groups: join their update with no rows
                exp = Experience([], [], torch.zeros(0), torch.zeros(0))
        updates = self.update(exp) if exp is not None else []
        sync = getattr(self.engine, "sync_weights", None)
        if updates and callable(sync):  # an engine holding its own copy of the weights (vLLM)
            sync()
        if exp is None:
            self.log(
                f"step {self.state.global_step + 1}: every group had equal rewards; no update "
                "(see frac_reward_zero_std; grpokit preflight explains the cold start)"
            )
            updates = [{"loss": 0.0, "grad_norm": 0.0}]
            self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()
        shared["time/update"] = time.perf_counter() - t1
        if self.state.global_step == 0:
            shared.update(self._forecast(shared))
        shared["num_tokens"] = float(
            sum(len(p) for p in scored.prompt_ids) * scored.group_size
            + sum(len(c) for c in scored.rollout.completion_ids)
        )
        shared = reduce_metrics(shared, self.dist)
        out = []
        for metrics in updates:
            self.state.global_step += 1
            record = {
                "epoch": self.stream.epoch_float,
                **shared,
                **metrics,
                "learning_rate": self.scheduler.get_last_lr()[0],
                "step_time": time.perf_counter() - t0,
            }
            out.append(record)
        self._log_completions(scored, advantages)
        self.state.epoch, self.state.position = self.stream.epoch, self.stream.position
        return out

    def _rollout_metrics(self, scored: ScoredBatch) -> dict[str, float]:
        return rollout_metrics(
            scored, self.rewards.max_values, text_ngram=self.cfg.monitors.text_ngram
        )

    def _forecast(self, metrics: dict[str, float]) -> dict[str, float]:
        return forecast_metrics(
            metrics, self.rewards.names, beta=self.args.beta, scale_rewards=self.args.scale_rewards
        )

    def _log_completions(self, scored: ScoredBatch, advantages: torch.Tensor) -> None:
        a = self.args
        if (
            not self.dist.is_main
            or not a.log_completions
            or self.state.global_step % a.log_completions_steps
        ):
            return
        rows = completion_records(
            scored,
            step=self.state.global_step,
            limit=a.num_completions_to_print,
            advantages=advantages,
        )
        with (self.run_dir / "completions.jsonl").open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)

    # ---- held-out check ------------------------------------------------------------------------

    def heldout_metrics(self) -> dict[str, float]:
        """Rewards on held-out prompts with a fixed seed, so evaluations are comparable."""
        rows = self.heldout[: self.args.eval_max_prompts]
        if not rows:
            return {}
        if not self.dist.is_main:
            if self.sharded:  # rank 0 evaluates alone, but gathering its weights takes every rank
                with gathered(self.policy.model):
                    pass
            return {}
        scored = sample_and_score(
            self.engine,
            self.policy.tokenizer,
            rows,
            self.rewards,
            num_generations=self.args.eval_samples,
            sampling=self.sampling,
            system_prompt=self.system_prompt,
            max_prompt_length=self.args.max_prompt_length,
            generator=torch.Generator().manual_seed(self.args.seed + 1),
        )
        out: dict[str, float] = {}
        s = scored.scores
        for r in summarize(s, self.rewards.max_values):
            out[f"eval/{r.name}/mean"] = r.mean
            if r.pass_rate is not None:
                out[f"eval/{r.name}/pass_rate"] = r.pass_rate
        valid = s.total[~torch.isnan(s.total)]
        out["eval/reward"] = float(valid.mean()) if len(valid) else float("nan")
        return out

    # ---- driving the run -----------------------------------------------------------------------

    def save(self) -> Path:
        """Write a checkpoint (rank 0 only; the other ranks wait for it)."""
        path = self.run_dir / f"checkpoint-{self.state.global_step}"
        # Under FSDP every rank takes part in gathering the whole tensors that rank 0 writes.
        states = full_state(self.policy.model, self.optimizer) if self.sharded else (None, None)
        if self.dist.is_main:
            path = self._save(*states)
        barrier(self.dist)
        return path

    def _save(
        self,
        model_state: dict[str, torch.Tensor] | None = None,
        optimizer_state: dict[str, Any] | None = None,
    ) -> Path:
        return save_checkpoint(
            self.run_dir,
            policy=self.policy,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            generator=self.generator,
            state=self.state,
            config_yaml=self.cfg.to_yaml(),
            save_total_limit=self.args.save_total_limit,
            model_state=model_state,
            optimizer_state=optimizer_state,
        )

    def train(self) -> TrainResult:
        a = self.args
        ckpt: Path | None = None
        with (
            progress_bar(
                self.total_steps, self.state.global_step, enabled=self.show_progress
            ) as advance,
            interrupt_guard() as interrupted,
        ):
            while self.state.global_step < self.total_steps and not interrupted():
                records = self.step()
                first_step = self.state.global_step - len(records) + 1
                for step, record in enumerate(records, start=first_step):
                    if a.eval_steps and step % a.eval_steps == 0:
                        record.update(self.heldout_metrics())
                    alerts = self.monitors.update(step, record)
                    if alerts:
                        record["alerts"] = [al.to_dict() for al in alerts]
                        for al in alerts:
                            self.log(f"[monitor] {al}")
                    for sink in self.sinks:
                        sink.log(step, record)
                    self.history.append({"step": step, **record})
                    advance(step, record)
                if a.save_steps and self.state.global_step % a.save_steps == 0:
                    ckpt = self.save()
            if interrupted():
                ckpt = self.save()
                self.close()
                raise KeyboardInterrupt(
                    f"interrupted at step {self.state.global_step}; checkpoint saved to {ckpt}; "
                    f"continue with: grpokit train --resume {self.run_dir}"
                )
        if ckpt is None or not ckpt.name.endswith(f"-{self.state.global_step}"):
            ckpt = self.save()
        self.close()
        return TrainResult(self.run_dir, self.state.global_step, ckpt, self.history)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []
        self.rewards.close()
