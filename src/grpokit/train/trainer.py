"""The GRPO training loop: rollout -> reward -> advantage -> update -> log, in one readable place.

`GRPOTrainer.step()` is the whole algorithm of one generation round and its optimizer steps (one,
or num_iterations passes over steps_per_generation / gradient_accumulation_steps slices);
the set-up is a list of named steps (:mod:`grpokit.train.setup`), and checkpoints live in
:mod:`grpokit.train.checkpoint`. The loss is a :class:`~grpokit.core.losses.PolicyLoss`: the
trainer feeds it micro-batches and weights them as it says, without knowing the loss type.
"""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from grpokit.config import GRPOKitConfig, load_prompt_rows
from grpokit.core.advantages import MULTI_OBJECTIVE_AGGREGATIONS
from grpokit.core.curriculum import PromptRecord
from grpokit.core.losses import LossInputs, StepCounts
from grpokit.core.stats import cluster_mean_stderr
from grpokit.data.prompts import check_columns
from grpokit.errors import RunFailed, RunStopped, UserError
from grpokit.files import write_jsonl
from grpokit.models.loading import Policy
from grpokit.models.manifest import CheckpointDamaged
from grpokit.models.onednn import frozen_casts_kept
from grpokit.monitor import MonitorSet
from grpokit.monitor.sinks import JsonlSink, MetricsSink, read_metrics
from grpokit.monitor.trackers import ReportBuilder, missing_tracker_packages
from grpokit.progress import Progress, eta_text, on_terminal, progress
from grpokit.rewards._base import RewardError
from grpokit.rewards.compose import RewardSet, build_reward_set
from grpokit.rewards.registry import BuildContext
from grpokit.rollout.base import RolloutEngine
from grpokit.sampling import (
    Sampler,
    ScoredBatch,
    check_tools,
    checkpoint_dirs,
    latest_checkpoint,
    resolve_device,
    seed_everything,
    tool_rollout,
)
from grpokit.train.best import record_checkpoint, record_eval, stops_early
from grpokit.train.checkpoint import (
    TrainerState,
    load_checkpoint,
    read_curriculum,
    remove_partial_checkpoints,
    rng_state,
    save_checkpoint,
)
from grpokit.train.console import reward_warnings_to, stop_guard
from grpokit.train.curriculum import PromptCurriculum
from grpokit.train.data_order import PromptStream
from grpokit.train.distributed import (
    all_reduce_scalars,
    barrier,
    check_shared_run_dir,
    gather_rows,
    init_distributed,
    reduce_metrics,
)
from grpokit.train.entropy_control import EntropyStep
from grpokit.train.failures import (
    NonFiniteSteps,
    describe_failure,
    disk_full_advice,
    is_disk_full,
    signal_name,
)
from grpokit.train.forward import Scores, TokenBatch, completion_scores
from grpokit.train.fsdp import LockStep, full_state, gathered
from grpokit.train.no_signal import Advice, NoSignalWatch, no_signal_warning
from grpokit.train.rollout_record import Rollout, TrainBatch, topped_up
from grpokit.train.rollouts import Rollouts
from grpokit.train.setup import (
    build_engine,
    build_loss,
    build_optimizer,
    build_policy,
    fit_to_context,
    open_sinks,
    total_steps,
    with_process_count,
    write_run_files,
)
from grpokit.train.step_metrics import (
    LossSums,
    completion_records,
    forecast_metrics,
    forecast_summary,
    generation_rate,
    heldout_hint,
    memory_metrics,
    rollout_metrics,
    sampled_tokens,
    step_summary,
    unparsed_warning,
)


@dataclass
class TrainResult:
    run_dir: Path
    global_step: int
    checkpoint: Path | None
    history: list[dict[str, Any]] = field(default_factory=list)


def heldout_metric_names(rewards: RewardSet) -> list[str]:
    """The metrics the periodic held-out eval can log (:meth:`GRPOTrainer.heldout_metrics`) that
    rank checkpoints (not the standard errors): what training.metric_for_best_model may name."""
    names = ["eval/reward"]
    for name, top in zip(rewards.names, rewards.max_values, strict=True):
        names.append(f"eval/{name}/mean")
        if top is not None:  # a pass is reaching the reward's maximum
            names.append(f"eval/{name}/pass_rate")
    return names + [f"eval/{part}/pass_rate" for part in rewards.part_names]


@dataclass(frozen=True)
class _StepPlan:
    """One optimizer step's micro-batches, with the log-probs that stay fixed during the update
    in them, and its counts."""

    batches: list[TrainBatch]
    counts: StepCounts


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
        build_report: ReportBuilder | None = None,
        advise: Advice | None = None,
    ) -> None:
        """``advise``: what to say when steps in a row have no learning signal (the command
        passes preflight's advice; without it the warning points to `grpokit preflight`).

        Set-up in the order that finds a mistake cheapest: processes, then data and rewards
        (before the slow model load), the model and its sampler, the update, the outputs."""
        self.run_dir = (run_dir or cfg.output_dir).resolve()
        self.log = log
        self.advise = advise
        self.no_signal = NoSignalWatch()
        self._warn_no_signal = False  # the round just run completed a streak without signal
        self.show_progress = progress
        seed_everything(cfg.training.seed)
        self._join_processes(cfg)
        rewards, system_prompt = self._load_data_and_rewards()
        self._load_model(rewards, system_prompt)
        self._set_up_update()
        self.state = self._restore() if resume else TrainerState()
        self._open_outputs(rewards, resume=resume, build_report=build_report)
        self.history: list[dict[str, Any]] = []
        # The state and random states at the start of the running step (None between steps),
        # and whether it has changed the weights yet: what an emergency checkpoint may save.
        self._before_step: tuple[TrainerState, dict[str, Any]] | None = None
        self._weights_changed = False
        self._last_save = time.monotonic()
        self._warned_unparsed = False  # calls outside the tool-call format: said once a run
        # The last periodic eval's (step, value of training.metric_for_best_model): a checkpoint
        # of that step competes for the best one. And whether it set a new best (save_strategy:
        # best saves then).
        self._last_eval: tuple[int, float] | None = None
        self._new_best = False

    # ---- set-up stages (in __init__'s order) ---------------------------------------------------

    def _join_processes(self, cfg: GRPOKitConfig) -> None:
        """The process group (one process without a launcher), the device, and what only rank 0
        does (talk, show progress)."""
        self.dist, self.device = init_distributed(resolve_device(cfg.model.device))
        self.cfg = with_process_count(cfg, self.dist)
        self.args = self.cfg.training
        if not self.dist.is_main:  # only rank 0 talks
            self.log = lambda message: None
            self.show_progress = False
        # A live bar on a terminal; otherwise (progress off, a log file, CI) a line per step.
        self.live_bar = self.show_progress and on_terminal()
        # Sharding over one process would save nothing, so the same config runs on a laptop. A
        # process that has joined a process group of one itself shards all the same: that runs
        # the FSDP code on a single GPU (bench/gpu_check.py), where two processes cannot share it.
        self.sharded = self.args.fsdp and (self.dist.enabled or torch.distributed.is_initialized())
        if self.args.fsdp and not self.sharded:
            self.log(
                "training.fsdp: a single process holds the whole model; FSDP needs 2+ processes"
            )

    def _load_data_and_rewards(self) -> tuple[RewardSet, str | None]:
        """Prompts, system prompt, the run directory, tools and rewards: their errors are cheap
        to find and must come before the model loads."""
        self.rows = load_prompt_rows(self.cfg, "train")
        self.heldout = load_prompt_rows(self.cfg, "heldout") if self.cfg.data.heldout else []
        system_prompt = self.cfg.system_prompt
        self.run_dir.mkdir(parents=True, exist_ok=True)
        check_shared_run_dir(self.run_dir, self.dist)  # several machines: one directory for all
        if self.dist.is_main:
            for leftover in remove_partial_checkpoints(self.run_dir):
                self.log(f"removed {leftover.name}, left by a checkpoint write that did not finish")
        # Imports the tools and environment, reads the tokenizer: before any model loads.
        check_tools(self.cfg, probe_row=self.rows[0] if self.rows else None)
        rewards = self._build_rewards()
        missing_tracker_packages(self.args.report_to)  # before the slow model load
        return rewards, system_prompt

    def _load_model(self, rewards: RewardSet, system_prompt: str | None) -> None:
        """The policy, the sampler over it, and the prompts cut to what fits its context."""
        self.policy: Policy = build_policy(
            self.cfg, device=self.device, dist=self.dist, sharded=self.sharded
        )
        self.sampler = Sampler(
            self.policy,
            build_engine(self.cfg, self.policy, sharded=self.sharded),
            rewards,
            self.args.sampling_params,
            system_prompt,
            self.args.max_prompt_length,
            self.args.chat_template_kwargs,
            tools=tool_rollout(self.cfg, self.policy.tokenizer),
        )
        # The tools' schemas are part of every prompt the chat template renders: counted too.
        schemas = self.sampler.tools.schemas if self.sampler.tools is not None else None
        self.rows = fit_to_context(
            self.cfg, self.policy, self.rows, "train", self.log, tools=schemas
        )
        self.heldout = fit_to_context(
            self.cfg, self.policy, self.heldout, "heldout", self.log, tools=schemas
        )

    def _set_up_update(self) -> None:
        """The loss, optimizer and schedule, the prompt order (and curriculum), and the
        rollouts that feed each step."""
        # Ranks sample different completions; rank 0 draws what a single process would.
        self.generator = torch.Generator().manual_seed(self._rank_seed(0))
        a = self.args
        self.loss = build_loss(a)
        self.entropy_control = a.entropy_control
        self.lockstep = LockStep(
            self.dist, sharded=self.sharded, pad_token_id=self.pad_token_id, device=self.device
        )
        self.total_steps = total_steps(a, len(self.rows))
        self.optimizer, self.scheduler = build_optimizer(
            a, self.policy.trainable_parameters(), self.total_steps
        )
        self.stream = PromptStream(self.rows, seed=a.seed, shuffle=self.cfg.data.shuffle)
        curriculum = a.curriculum_settings
        self.curriculum = (
            PromptCurriculum(curriculum, num_prompts=len(self.rows), seed=a.seed)
            if curriculum is not None
            else None
        )
        drawn = self.total_steps * a.prompts_per_step  # at least: dynamic sampling draws more
        if self.curriculum is not None and not a.dynamic_sampling and drawn <= len(self.rows):
            # It acts from a prompt's second draw; the demo's 20 steps met 40 of 256 once.
            self.log(
                f"training.curriculum: this run draws {drawn} prompts of {len(self.rows)}, so "
                "none comes round again and the curriculum changes nothing; it acts from a "
                "prompt's second draw (more steps, or fewer prompts)"
            )
        # The curriculum's records at the start of the running step: what an emergency
        # checkpoint saves with the state of that moment.
        self._curriculum_before: dict[int, PromptRecord] | None = None
        self.rollouts = Rollouts(
            self.stream,
            self.sampler,
            self.dist,
            num_generations=a.num_generations,
            generator=self.generator,
            advantages=self._local_advantages,
            mask_truncated_completions=a.mask_truncated_completions,
            max_staleness=a.max_staleness,
            curriculum=self.curriculum,
        )

    def _open_outputs(
        self, rewards: RewardSet, *, resume: bool, build_report: ReportBuilder | None
    ) -> None:
        """The run's files and metric sinks (rank 0 alone writes), and the monitors, given back
        the steps logged before a resumed checkpoint."""
        self.sinks: list[MetricsSink] = []
        if self.dist.is_main:  # one writer per run directory
            write_run_files(self.cfg, self.run_dir)
            self.sinks = open_sinks(
                self.cfg,
                self.run_dir,
                resume_step=self.state.global_step if resume else None,
                log=self.log,
                build_report=build_report,
            )
        self.monitors = MonitorSet(
            self.cfg.monitors,
            rewards.names,
            {n: m for n, m in zip(rewards.names, rewards.max_values, strict=True) if m is not None},
        )
        if resume and self.dist.is_main:
            # The monitors judge a change against the run's earlier steps: give them back the
            # steps logged before the checkpoint (metrics.jsonl is already cut back to it). Their
            # alerts were recorded then.
            for row in read_metrics(self.run_dir / "metrics.jsonl")[0]:
                if isinstance(row.get("step"), int) and row["step"] <= self.state.global_step:
                    self.monitors.update(row["step"], row)

    # ---- set-up helpers ------------------------------------------------------------------------

    def _build_rewards(self) -> RewardSet:
        rewards = build_reward_set(
            self.cfg.rewards,
            BuildContext(base_dir=self.cfg.config_dir, run_dir=self.run_dir, seed=self.args.seed),
        )
        try:
            check_columns(self.rows, rewards.required_columns, str(self.cfg.data.train))
            if self.heldout:
                check_columns(self.heldout, rewards.required_columns, str(self.cfg.data.heldout))
            best = self.args.best_metric
            logged = heldout_metric_names(rewards)
            if best is not None and best not in logged:
                raise UserError(
                    f"training.metric_for_best_model: the held-out eval of this config does not "
                    f"log {best}; it logs {', '.join(logged)}"
                )
        except BaseException:
            rewards.close()
            raise
        return rewards

    def _restore(self) -> TrainerState:
        """Load the newest intact checkpoint. A damaged one is named with what is wrong and the
        one before it is tried; with none intact, one message lists them all."""
        found = checkpoint_dirs(self.run_dir)
        if not found:
            raise UserError(f"{self.run_dir}: no checkpoint-<step> directory to resume from")
        damaged: list[CheckpointDamaged] = []
        records = None
        for ckpt in reversed(found):
            try:
                records = self._read_curriculum(ckpt)
                state = load_checkpoint(
                    ckpt,
                    policy=self.policy,
                    optimizer=self.optimizer,
                    scheduler=self.scheduler,
                    generator=self.generator,
                    sharded=self.sharded,
                )
            except CheckpointDamaged as e:
                self.log(f"{ckpt.name} is damaged: {e}")
                damaged.append(e)
                continue
            break
        else:
            listed = "; ".join(str(e) for e in damaged)
            raise UserError(
                f"{self.run_dir}: no intact checkpoint to resume from ({listed}). Start a new "
                "run, or restore a checkpoint from a copy"
            )
        self.stream.seek(state.epoch, state.position)
        if self.curriculum is not None:
            if records is None:
                self.log(f"{ckpt.name} has no curriculum records: the curriculum starts afresh")
            else:
                self.curriculum.records = records
        if self.dist.rank:  # the checkpoint holds rank 0's generator
            self.generator.manual_seed(self._rank_seed(state.generation_round))
        if damaged:
            self.log(
                f"resuming from {ckpt.name}, the newest intact checkpoint, at step "
                f"{state.global_step} (the steps after it run again)"
            )
        self.log(f"resumed from {ckpt} at step {state.global_step}")
        return state

    def _read_curriculum(self, ckpt: Path) -> dict[int, PromptRecord] | None:
        """The curriculum's records saved in ``ckpt`` (None: curriculum off, or none saved)."""
        if self.curriculum is None:
            return None
        data = read_curriculum(ckpt)
        if data is None:
            return None
        try:
            return self.curriculum.parse(data)
        except ValueError as exc:
            raise CheckpointDamaged(ckpt / "curriculum.json", str(exc)) from None

    @property
    def engine(self) -> RolloutEngine:
        return self.sampler.engine

    @property
    def rewards(self) -> RewardSet:
        return self.sampler.rewards

    @property
    def pad_token_id(self) -> int:
        return self.policy.pad_token_id

    def _rank_seed(self, offset: int) -> int:
        return self.args.seed + 1_000_003 * self.dist.rank + offset

    def _local_advantages(self, total: torch.Tensor, per_function: torch.Tensor) -> torch.Tensor:
        """Advantages (n,) of this rank's rewards (total (n,), per_function (n, F)), computed over
        the global batch so that a batch std (scale_rewards: batch, normalize_then_sum) is the
        global one (ranks hold equal shares)."""
        a = self.args
        aggregation = MULTI_OBJECTIVE_AGGREGATIONS[a.multi_objective_aggregation]
        advantages = aggregation.advantages(
            gather_rows(total, self.dist),
            gather_rows(per_function, self.dist),
            torch.tensor(self.rewards.weights, dtype=per_function.dtype),
            a.num_generations,
            estimator=a.advantage_estimator,
            scale=a.scale_rewards,
        )
        n = total.shape[0]
        return advantages[self.dist.rank * n : (self.dist.rank + 1) * n]

    # ---- the algorithm -------------------------------------------------------------------------

    def collect(self) -> Rollout:
        """Rollout and reward: G completions for each of the step's prompts, and advantages.

        With dynamic_sampling, groups whose rewards are all equal (no signal) are dropped and more
        prompts are sampled, up to max_dynamic_sampling_rounds generation rounds.
        """
        a = self.args
        want_groups = a.prompts_per_step
        rounds: list[Rollout] = []
        kept: list[torch.Tensor] = []  # each round's rows the update trains on, (B_r,) bool
        metrics = {"time/generate": 0.0, "time/score": 0.0}
        n_groups = generated = 0
        max_rounds = a.max_dynamic_sampling_rounds if a.dynamic_sampling else 1
        later_rounds = -(-(self.total_steps - self.state.global_step) // a.updates_per_round) - 1
        no_signal = MULTI_OBJECTIVE_AGGREGATIONS[a.multi_objective_aggregation].no_signal
        for _ in range(max_rounds):
            need = want_groups - n_groups if a.dynamic_sampling else want_groups
            drawn = self.rollouts.next(need, later_rounds=later_rounds)
            scored = drawn.scored
            assert scored is not None  # a sampled round has its scored batch
            self.state.generation_round += 1
            metrics["time/generate"] += scored.generate_seconds
            metrics["time/score"] += scored.score_seconds
            generated += sum(sampled_tokens(scored.rollout))
            metrics |= drawn.metrics
            scores = scored.scores
            if self.curriculum is not None:  # every rank records every group of the round
                total = gather_rows(scores.total, self.dist)
                flat = no_signal(
                    total, gather_rows(scores.per_function, self.dist), a.num_generations
                )
                self.curriculum.observe(drawn.indices, total, flat)
            keep = torch.ones(len(scored.rows), dtype=torch.bool)
            if a.dynamic_sampling:
                keep = ~no_signal(scores.total, scores.per_function, a.num_generations)
            rounds.append(drawn)
            kept.append(keep.repeat_interleave(a.num_generations))  # a group's keep, its rows'
            n_groups += int(all_reduce_scalars([float(keep.sum())], self.dist)[0])
            if n_groups >= want_groups:
                break
        metrics |= generation_rate(generated, metrics["time/generate"])
        return topped_up(rounds, kept, metrics)

    def _fixed_logprobs(self, part: Rollout, batches: list[TrainBatch]) -> list[TrainBatch]:
        """``part``'s micro-batches with the log-probs that stay fixed during the update, those
        the loss needs: pi_old (several optimizer steps per generation) and pi_ref (a KL penalty;
        the engine's where it scored the tokens under the reference model as it generated
        them)."""
        needs = self.loss.needs
        if needs.old_logp:
            old = self.frozen_logprobs(contextlib.nullcontext(self.policy.model), batches)
            batches = [replace(b, old_logps=o) for b, o in zip(batches, old, strict=True)]
        if not needs.ref_logp:
            return [replace(b, ref_logps=None) for b in batches]
        # Decided on the rollout, not on its micro-batches: a rank with no rows has none, and
        # must still take part in the reference forward (under FSDP a collective) as the
        # others do.
        if part.ref_logps is not None:
            return batches
        # The KL's: untruncated, as the engine's reference log-probs are.
        ref = self.frozen_logprobs(self.policy.reference_model(), batches, truncated=False)
        return [replace(b, ref_logps=r) for b, r in zip(batches, ref, strict=True)]

    def frozen_logprobs(
        self,
        model_context: AbstractContextManager[torch.nn.Module],
        batches: list[TrainBatch],
        truncated: bool = True,
    ) -> list[torch.Tensor]:
        """(B, C) each micro-batch's log-probs of its completions under the model the context
        gives (the policy for pi_old, :meth:`Policy.reference_model` for pi_ref), without
        gradients; ``truncated``: of the truncated sampling distribution where
        :attr:`truncation` says so."""
        with torch.no_grad(), model_context as model:
            out = [
                self._logprobs(model, b.tokens.to(self.device), truncated=truncated)[0]
                for b in batches
            ]
            self.lockstep.finish(model, backward=False)
        return out

    @property
    def truncation(self) -> tuple[int, float] | None:
        """(top_k, top_p) when the trainer scores the truncated sampling distribution
        (training.truncated_logprobs, and top-k or top-p truncates; top_k 1 is greedy)."""
        a = self.args
        top_k = a.top_k or 0
        if not a.truncated_logprobs or top_k == 1 or not (top_k > 0 or a.top_p < 1.0):
            return None
        return top_k, a.top_p

    def _logprobs(
        self,
        model: torch.nn.Module,
        batch: TokenBatch,
        with_entropy: bool = False,
        truncated: bool = True,
        entropy_grad: bool = False,
    ) -> Scores:
        """(log-probs, entropy, log S): the log-probs of the truncated sampling distribution
        where :attr:`truncation` says so and ``truncated``, with log S (the log of the kept mass)
        beside them; the full softmax's otherwise, log S None."""
        # Encoding each prompt once takes one forward more where a micro-batch shares prompts;
        # under FSDP every forward is a collective, so all ranks must run the same number. Keyed
        # on the config, not on the process count, so that one process computes exactly what the
        # same YAML computes sharded.
        return completion_scores(
            model,
            batch,
            temperature=self.args.temperature,
            with_entropy=with_entropy,
            share_prompts=not self.args.fsdp,
            logprob_chunk_size=self.args.logprob_chunk_size,
            padding_free=self.args.padding_free,
            truncation=self.truncation if truncated else None,
            entropy_grad=entropy_grad,
        )

    def update(self, rollout: Rollout) -> list[dict[str, float]]:
        """num_iterations passes over one rollout's rows, each an optimizer step on every one
        of its updates_per_generation slices in turn (TRL's steps_per_generation); metrics of
        each step. The rollout engine then takes the new weights (vLLM holds its own copy)."""
        a = self.args
        steps: list[_StepPlan] = []
        with frozen_casts_kept(self.policy.model):
            # pi_old of every slice before the first update: all were drawn from it.
            for part in rollout.split(a.updates_per_generation):
                batches = part.train_batches(
                    a.per_device_train_batch_size,
                    a.max_tokens_per_micro_batch,
                    packed=a.padding_free,
                    pad_token_id=self.pad_token_id,
                )
                self.lockstep.plan(len(batches))
                batches = self._fixed_logprobs(part, batches)
                # Global counts: each rank's loss is then its share of the global loss (grads
                # are summed).
                active, num_rows = all_reduce_scalars([part.active_tokens(), len(part)], self.dist)
                counts = StepCounts(
                    max(1, int(active)), max(1, int(num_rows)), a.max_completion_length
                )
                steps.append(_StepPlan(batches, counts))
            if not self.policy.model.training:  # the switch walks every module, even a no-op
                self.policy.model.train()
            records = []
            for _ in range(a.num_iterations):
                for step in steps:
                    self.lockstep.plan(len(step.batches))
                    sums = LossSums(self.device)
                    entropy = EntropyStep.start(self.entropy_control, self.state)
                    for batch in step.batches:
                        self._loss_and_backward(batch, step.counts, sums, entropy)
                    self.lockstep.finish(self.policy.model, backward=True)
                    records.append(self._apply_gradients(sums))
                    if entropy.active:
                        entropy.finish(records[-1], self.state)
        self.engine.sync_weights()
        return records

    def _loss_and_backward(
        self,
        batch: TrainBatch,
        counts: StepCounts,
        sums: LossSums,
        entropy_step: EntropyStep,
    ) -> None:
        """Forward one micro-batch, add its share of the step's loss to the gradients."""
        batch = batch.to(self.device)
        mask = batch.loss_mask
        logp, entropy, log_kept = self._logprobs(
            self.policy.model,
            batch.tokens,
            with_entropy=True,
            entropy_grad=entropy_step.entropy_grad,
        )
        assert entropy is not None
        ent = entropy_step.micro_batch(entropy, mask, counts.num_active_tokens)
        # Truncated sampling: the ratios on the truncated distribution, the KL on the full one.
        kl_logp = None if log_kept is None else logp + log_kept
        out = self.loss(
            LossInputs(
                logp,
                batch.old_logps,
                batch.advantages,
                mask,
                batch.ref_logps,
                counts,
                batch.sampler_logps,
                kl_logp,
                policy_mask=ent.policy_mask,
            )
        )
        assert counts.num_sequences is not None
        weight = self.loss.micro_batch_weight(len(batch), counts.num_sequences)
        # The bonus is already this micro-batch's share of the step's (divided by the step's
        # tokens), so it takes no micro-batch weight.
        loss = out.loss * weight if ent.bonus is None else out.loss * weight - ent.bonus
        torch.autograd.backward(loss)
        if entropy_step.active:
            out.metrics.update(ent.metrics)
        sums.add(out, weight, mask, entropy.detach())

    def _apply_gradients(self, sums: LossSums) -> dict[str, float]:
        """Reduce, clip and apply the summed gradients, unless the loss or the norm is not finite
        (the step is then skipped and counted); advance the schedule either way."""
        # The optimizer's own list: walking the model for it takes longer than the clipping.
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        grad_norm = self.lockstep.clip_gradients(parameters, self.args.max_grad_norm)
        metrics, tokens = sums.to_host(grad_norm)  # the step's one wait on the device
        # A NaN or infinite loss or norm would poison the weights and Adam's moments: skip the
        # step (all ranks agree: the norm is of the reduced gradients).
        if math.isfinite(metrics["grad_norm"]) and math.isfinite(metrics["loss"]):
            self._weights_changed = True
            self.optimizer.step()
            self.state.nonfinite_streak = 0
        else:
            self.state.skipped_steps += 1
            self.state.nonfinite_streak += 1
        self._advance_schedule()
        metrics["skipped_steps"] = float(self.state.skipped_steps)
        return reduce_metrics(metrics, self.dist, weight=tokens)

    def _advance_schedule(self) -> None:
        with warnings.catch_warnings():  # a skipped step's schedule still advances, on purpose
            warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _no_update(self) -> list[dict[str, float]]:
        """A round whose groups all had equal rewards has nothing to learn from: no gradient,
        but it still counts its steps, as :func:`total_steps` and the schedule do."""
        self.log(
            f"step {self.state.global_step + 1}: every group had equal rewards; no update "
            "(see frac_reward_zero_std; grpokit preflight explains the cold start)"
        )
        records = []
        for _ in range(self.args.updates_per_round):
            self._advance_schedule()
            records.append({"loss": 0.0, "grad_norm": 0.0})
        return records

    def _anyone_trains(self, rollout: Rollout) -> bool:
        """Whether any rank has rows to train on. With several processes, a rank whose groups all
        had equal rewards joins the others' update with none (its collectives pair with theirs);
        alone, none means no update."""
        return bool(all_reduce_scalars([float(rollout.has_rows)], self.dist, "max")[0])

    def step(self) -> list[dict[str, Any]]:
        """One generation round and its optimizer steps (updates_per_round); their metrics."""
        t0 = time.perf_counter()
        rollout = self.collect()
        scored, scored_advantages = rollout.scored, rollout.scored_advantages
        assert scored is not None and scored_advantages is not None  # collect() samples
        t1 = time.perf_counter()
        text_ngram = self.cfg.monitors.text_ngram
        tools = self.sampler.tools.names if self.sampler.tools is not None else ()
        shared = rollout_metrics(
            scored, self.rewards.max_values, text_ngram=text_ngram, tool_names=tools
        )
        shared |= rollout.metrics
        if self.curriculum is not None:
            shared |= self.curriculum.metrics()
        trains = self._anyone_trains(rollout)
        updates = self.update(rollout) if trains else self._no_update()
        shared["time/update"] = time.perf_counter() - t1
        shared |= memory_metrics(self.device)
        if self.state.global_step == 0:
            a = self.args
            names = self.rewards.names
            shared |= forecast_metrics(
                shared,
                names,
                beta=a.beta,
                scale_rewards=a.scale_rewards,
                part_names=self.rewards.part_names,
            )
        shared["num_tokens"] = float(
            sum(len(p) for p in scored.prompt_ids) * scored.group_size
            + sum(len(c) for c in scored.rollout.completion_ids)
        )
        shared = reduce_metrics(shared, self.dist)
        # No group with a reward spread on any rank: every advantage is 0. (With dynamic
        # sampling a later round may have found groups with one; the rollout then holds them.)
        flat = not trains or (
            not self.args.dynamic_sampling and shared["frac_reward_zero_std"] >= 1.0
        )
        self._warn_no_signal = self.no_signal.update(flat, scored, len(updates))
        warning = unparsed_warning(shared, lenient=self.args.tool_call_lenient)
        if warning is not None and not self._warned_unparsed:
            self._warned_unparsed = True
            self.log(f"warning: {warning}")
        out = []
        for metrics in updates:
            self.state.global_step += 1
            out.append(
                {
                    "epoch": self.stream.epoch_float,
                    **shared,
                    **metrics,
                    "learning_rate": self.scheduler.get_last_lr()[0],
                    "step_time": time.perf_counter() - t0,
                }
            )
        self._log_completions(scored, scored_advantages)
        self.state.epoch, self.state.position = rollout.epoch, rollout.position
        return out

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
        scored = self.sampler.score_prompts(rows, self.args.eval_samples, seed=self.args.seed + 1)
        out: dict[str, float] = {}
        for j, r in enumerate(scored.summary()):
            out[f"eval/{r.name}/mean"] = r.mean
            if r.pass_rate is not None:
                out[f"eval/{r.name}/pass_rate"] = r.pass_rate
            stderr = cluster_mean_stderr(scored.per_prompt(j))
            if stderr is not None:  # lets the heldout monitor test a drop against eval noise
                out[f"eval/{r.name}/stderr"] = stderr
        out.update({f"eval/{key}": value for key, value in scored.part_pass_rates().items()})
        total = torch.cat([b.scores.total for b in scored.batches])
        valid = total[~torch.isnan(total)]
        out["eval/reward"] = float(valid.mean()) if len(valid) else float("nan")
        stderr = cluster_mean_stderr(scored.per_prompt())
        if stderr is not None:
            out["eval/reward/stderr"] = stderr
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
        rng: dict[str, Any] | None = None,
    ) -> Path:
        self._last_save = time.monotonic()
        step = self.state.global_step
        was_best = (self.state.best_model_checkpoint, self.state.best_model_checkpoint_metric)
        if self.args.best_metric is not None:
            value = self._last_eval[1] if self._last_eval and self._last_eval[0] == step else None
            # Recorded before the write: the checkpoint's own trainer_state.json names it.
            record_checkpoint(self.state, step, value, greater=self.args.best_is_greater)
        try:
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
                rng=rng,
                curriculum=self.curriculum.state() if self.curriculum is not None else None,
            )
        except BaseException:  # not written: the best one is still the one before
            self.state.best_model_checkpoint, self.state.best_model_checkpoint_metric = was_best
            raise

    def train(self) -> TrainResult:
        """Run to the end, logging, evaluating and checkpointing on the way.

        Ctrl-C or SIGTERM: finish the step, save, raise :class:`RunStopped`. Any failure (a
        reward that raises, out of memory, NaN steps one after another, a full disk): save the
        last completed step where that is possible and raise :class:`RunFailed` saying what
        failed and how to resume.
        """
        a = self.args
        ckpt: Path | None = None
        save_every = a.save_interval(self.steps_per_epoch)
        self._last_save = time.monotonic()
        with (
            # A live bar on a terminal; in a log (CI, SLURM, nohup) a metrics line every step.
            progress(
                "GRPO", self.total_steps, done=self.state.global_step,
                enabled=self.live_bar, log=self.log,
            ) as bar,
            stop_guard() as stopped,
            reward_warnings_to(self.log),
        ):  # fmt: skip
            try:
                while self.state.global_step < self.total_steps and stopped() is None:
                    # What a checkpoint of the last completed step holds, should this step fail.
                    self._before_step = (replace(self.state), rng_state(self.generator))
                    if self.curriculum is not None:
                        self._curriculum_before = self.curriculum.snapshot()
                    self._weights_changed = False
                    records = self.step()
                    self._before_step = None
                    self._log_records(records, bar)
                    if self.state.nonfinite_streak >= a.max_nonfinite_steps:
                        raise NonFiniteSteps(self.state.nonfinite_streak)
                    if self._save_due(save_every):
                        ckpt = self.save()
                    if self._stop_early():
                        break
            except Exception as exc:
                raise self._failed(exc) from exc
            signum = stopped()
            if signum is not None:
                ckpt = self.save()
                self.close()
                raise RunStopped(
                    f"stopped by {signal_name(signum)} at step {self.state.global_step}; "
                    f"checkpoint saved to {ckpt}\ncontinue with: {self.resume_command}",
                    signum,
                )
        if ckpt is None or not ckpt.name.endswith(f"-{self.state.global_step}"):
            ckpt = self.save()
        ckpt = self._best_at_end(ckpt)
        if self.dist.is_main:
            hint = heldout_hint(
                heldout=bool(self.cfg.data.heldout),
                eval_steps=a.eval_steps,
                eval_interval=a.eval_interval,
                steps=self.state.global_step,
            )
            for line in forecast_summary(self.history, no_heldout=hint):
                self.log(line)
        self.close()
        return TrainResult(self.run_dir, self.state.global_step, ckpt, self.history)

    @property
    def steps_per_epoch(self) -> int:
        rounds = math.ceil(len(self.rows) / self.args.prompts_per_step)
        return max(1, rounds) * self.args.updates_per_round

    @property
    def resume_command(self) -> str:
        return f"grpokit train {shlex.quote(str(self.run_dir))}"

    def _save_due(self, every: int) -> bool:
        step = self.state.global_step
        minutes = self.args.save_minutes
        by_steps = bool(every) and step % every == 0
        by_time = bool(minutes) and time.monotonic() - self._last_save >= 60 * minutes
        by_best = self._new_best and self.args.save_strategy == "best"
        self._new_best = False
        # Every rank must agree: saving under FSDP is a collective (and only rank 0 evaluates).
        due = by_steps or by_time or by_best
        return bool(all_reduce_scalars([float(due)], self.dist, "max")[0])

    def _record_eval(self, step: int, record: dict[str, Any]) -> None:
        """The periodic eval of ``step`` against the best so far (rank 0, which evaluates)."""
        a = self.args
        key = a.best_metric
        if key is None or key not in record:
            return
        value = float(record[key])
        self._last_eval = (step, value)
        if record_eval(
            self.state, step, value, greater=a.best_is_greater, threshold=a.early_stopping_threshold
        ):
            self._new_best = True

    def _stop_early(self) -> bool:
        """Whether early_stopping_patience evals in a row have not improved; says so."""
        a = self.args
        if a.early_stopping_patience is None:  # the same config on every rank
            return False
        stop = stops_early(self.state, a.early_stopping_patience)
        if not all_reduce_scalars([float(stop)], self.dist, "max")[0]:
            return False
        if stop:  # rank 0, which evaluates and holds the best value
            self.log(
                f"early stopping at step {self.state.global_step}: {a.best_metric} has not "
                f"improved for {a.early_stopping_patience} evaluation(s) in a row (best "
                f"{self.state.best_metric:.4g} at step {self.state.best_global_step})"
            )
        return True

    def _best_at_end(self, last: Path) -> Path:
        """The run's model: its best checkpoint with load_best_model_at_end, else ``last``; the
        best one is named either way."""
        name = self.state.best_model_checkpoint
        if name is None or self.args.best_metric is None:
            return last
        best = self.run_dir / name
        self.log(
            f"best checkpoint: {best} ({self.args.best_metric} "
            f"{self.state.best_model_checkpoint_metric:.4g}); grpokit export "
            f"{shlex.quote(str(self.run_dir))} --best exports it"
        )
        return best if self.args.load_best_model_at_end else last

    def _log_records(self, records: list[dict[str, Any]], bar: Progress) -> None:
        """Held-out eval, monitors and sinks for each optimizer step of the round just run."""
        a = self.args
        eval_every = a.eval_interval
        first_step = self.state.global_step - len(records) + 1
        for step, record in enumerate(records, start=first_step):
            if eval_every and step % eval_every == 0:
                record.update(self.heldout_metrics())
                self._record_eval(step, record)
            alerts = self.monitors.update(step, record)
            if alerts:
                record["alerts"] = [al.to_dict() for al in alerts]
                for al in alerts:
                    self.log(f"[monitor] {al}")
            # metrics.jsonl (the record the monitors and the report read) takes every step; the
            # trackers every logging_steps, as in TRL, and the last step.
            reported = step % a.logging_steps == 0 or step == self.total_steps
            for sink in self.sinks:
                if reported or isinstance(sink, JsonlSink):
                    sink.log(step, record)
            self.history.append({"step": step, **record})
            bar.advance(1, step_summary(record))
            # Without the bar, a line every step: waiting logging_steps for the first sign of
            # life leaves a log looking stuck, and a step takes seconds, not milliseconds.
            if not self.live_bar:
                eta = bar.eta()
                left = f", about {eta_text(eta)} left" if eta is not None else ""
                self.log(f"step {step}/{self.total_steps}: {step_summary(record)}{left}")
        if self._warn_no_signal and self.dist.is_main:
            batches = self.no_signal.batches
            advice = self.advise(self.cfg, self.sampler, batches) if self.advise else None
            self.log(no_signal_warning(self.state.global_step, self.no_signal.streak, advice))

    def _failed(self, exc: Exception) -> RunFailed:
        """Save what can be saved after ``exc`` and say what happened and how to go on."""
        step = self.state.global_step + (1 if self._before_step is not None else 0)
        lines = [f"step {step} failed: {describe_failure(exc)}"]
        if isinstance(exc, RewardError) and exc.inputs and self.dist.is_main:
            path = self.run_dir / f"failed-step-{step}.jsonl"
            write_jsonl(path, exc.inputs)
            lines.append(
                f"the {len(exc.inputs)} completions reward {exc.reward!r} was scoring are in "
                f"{path}; replay them with: grpokit rewards check "
                f"{shlex.quote(str(self.run_dir / 'config.yaml'))} --completions "
                f"{shlex.quote(str(path))}"
            )
        lines.append(self._emergency_save(exc))
        lines.append(f"resume with: {self.resume_command}")
        self.close()
        return RunFailed("\n".join(lines))

    def _emergency_save(self, exc: Exception) -> str:
        """A checkpoint of the last completed step, or why there is none; one line."""
        latest = latest_checkpoint(self.run_dir)
        fallback = f"the latest checkpoint is {latest}" if latest else "there is no checkpoint yet"
        if is_disk_full(exc):
            return f"{disk_full_advice(self.run_dir, latest)}; {fallback}"
        if self.dist.enabled:
            # Another rank may be gone: a save, a collective, would wait for it forever.
            return f"no checkpoint written after the failure (several processes); {fallback}"
        if self._before_step is not None and self._weights_changed:
            return f"the failed step had already changed the weights, so {fallback}"
        rng = None
        if self._before_step is not None:  # back to where the failed step started
            self.state, rng = self._before_step
            if self.curriculum is not None and self._curriculum_before is not None:
                self.curriculum.records = self._curriculum_before
        try:
            path = self._save(rng=rng)
        except Exception as save_exc:
            full = is_disk_full(save_exc)
            why = disk_full_advice(self.run_dir, latest) if full else describe_failure(save_exc)
            return f"saving a checkpoint failed too ({why}); {fallback}"
        return f"checkpoint of step {self.state.global_step} saved: {path}"

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []
        self.rewards.close()
        self.engine.close()  # one generating ahead has a thread
