"""An engine that generates ahead of training: its generations overlap the trainer's update.

With a vLLM server the rollout runs in another process (another GPU, or other CPU cores), so
while the trainer updates on step k's completions the server can already sample step k+1's,
from the weights before step k's update: one step off-policy (``training.max_staleness: 1``).
:class:`AheadEngine` wraps such an engine and runs everything that reaches it, in the order it
was asked for, on one worker thread:

- :meth:`~AheadEngine.prefetch` queues a generation and returns at once;
- :meth:`~AheadEngine.generate` returns a prefetched generation of the same prompts (waiting for
  it if need be), or queues one and waits;
- :meth:`~AheadEngine.sync_weights` takes the policy's weights now (the engine's
  ``weights_snapshot``) and queues their push, so a generation queued before it runs on the
  older weights and one queued after it on the newer, never a mix.

Each batch is stamped with the number of weight pushes applied before it was generated
(``RolloutBatch.weight_version``); against :attr:`AheadEngine.weight_version`, the pushes asked
for so far, that is the batch's staleness in weight updates (TRL's ``max_staleness`` counts the
same). The gap between the older sampling policy and the trainer's is corrected like any other
sampler/trainer mismatch (``vllm_importance_sampling_correction``; docs/math.md).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import torch

from grpokit.rollout.base import EngineCapabilities, RolloutBatch, RolloutEngine, SamplingParams


class SnapshotEngine(Protocol):
    """An engine whose weight push can be split: the weights taken now, pushed later."""

    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch: ...

    def weights_snapshot(self) -> Callable[[], None]: ...


Key = tuple[tuple[tuple[int, ...], ...], int, SamplingParams]


def _key(prompt_ids: list[list[int]], n: int, params: SamplingParams) -> Key:
    return tuple(tuple(ids) for ids in prompt_ids), n, params


class AheadEngine(RolloutEngine):
    """A :class:`~grpokit.rollout.base.RolloutEngine` whose generations may be queued ahead.

    Its engine's own sampling seed drives sampling (a per-call generator cannot reach a server);
    the ``generator`` argument is accepted and unused, as by the vLLM engine.
    """

    capabilities = EngineCapabilities(weight_version=True, prefetch=True)

    def __init__(self, engine: SnapshotEngine) -> None:
        self.engine = engine
        self.weight_version: int = 0  # pushes asked for so far: the trainer's weight version
        self._applied = 0  # pushes the worker has applied (read and written on the worker only)
        self._push_failed: BaseException | None = None
        self._ahead: dict[Key, Future[RolloutBatch]] = {}
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpokit-rollout")

    def prefetch(self, prompt_ids: list[list[int]], n: int, params: SamplingParams) -> None:
        """Queue a generation; a later :meth:`generate` of the same arguments returns it."""
        self._ahead[_key(prompt_ids, n, params)] = self._worker.submit(
            self._generate, prompt_ids, n, params
        )

    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        future = self._ahead.pop(_key(prompt_ids, n, params), None)
        if future is None:
            future = self._worker.submit(self._generate, prompt_ids, n, params)
        return future.result()

    def sync_weights(self) -> None:
        """Take the policy's weights now; push them after the generations queued so far."""
        push = self.engine.weights_snapshot()
        self.weight_version += 1
        self._worker.submit(self._push, push)

    def close(self) -> None:
        """Drop the queued generations nobody will ask for (one already running finishes)."""
        for future in self._ahead.values():
            future.cancel()
        self._ahead.clear()

    # ---- on the worker thread ----------------------------------------------------------------

    def _generate(
        self, prompt_ids: list[list[int]], n: int, params: SamplingParams
    ) -> RolloutBatch:
        if self._push_failed is not None:
            # Sampling on from the weights before a failed push would train on the wrong policy.
            raise RuntimeError("pushing the weights to the rollout engine failed") from (
                self._push_failed
            )
        batch = self.engine.generate(prompt_ids, n, params)
        batch.weight_version = self._applied
        return batch

    def _push(self, push: Callable[[], None]) -> None:
        try:
            push()
        except BaseException as exc:
            self._push_failed = exc
            raise
        self._applied += 1
