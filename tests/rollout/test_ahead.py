"""An engine generating ahead: generations and weight pushes run in the order asked for, each
batch stamped with the weights it was sampled from; a failed push stops sampling.

The wrapped engine is a torch engine over its own copy of the policy, whose weights change only
when pushed, as a server's do; greedy decoding makes "which weights sampled this" checkable.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from grpokit.rollout.ahead import AheadEngine
from grpokit.rollout.base import RolloutBatch, SamplingParams
from grpokit.rollout.torch_engine import TorchEngine

EOS = 2
GREEDY = SamplingParams(max_completion_length=6, temperature=0.0)
PROMPTS = [[1, 2000, 300, 45, 7], [88, 99, 17]]


class CopyEngine:
    """Generates from its own copy of ``policy``; a push copies the policy's weights over."""

    def __init__(self, policy: torch.nn.Module) -> None:
        self.policy = policy
        self.copy = copy.deepcopy(policy)
        self.engine = TorchEngine(self.copy, eos_token_ids=[EOS], pad_token_id=EOS)
        self.fail_next_push = False

    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        return self.engine.generate(prompt_ids, n, params)

    def weights_snapshot(self) -> Callable[[], None]:
        state = {k: v.clone() for k, v in self.policy.state_dict().items()}
        fail = self.fail_next_push

        def push() -> None:
            if fail:
                raise OSError("the weights file could not be read")
            self.copy.load_state_dict(state)

        return push


def _step(model: torch.nn.Module, seed: int) -> None:
    """A change of the policy large enough to change its greedy tokens."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)) * 0.3)


def _greedy(model: torch.nn.Module) -> list[list[int]]:
    engine = TorchEngine(model, eos_token_ids=[EOS], pad_token_id=EOS)
    return engine.generate(PROMPTS, 1, GREEDY).completion_ids


def test_a_prefetched_batch_comes_from_the_weights_before_a_later_push(
    tiny_model: torch.nn.Module,
) -> None:
    ahead = AheadEngine(CopyEngine(tiny_model))
    before = _greedy(tiny_model)
    ahead.prefetch(PROMPTS, 1, GREEDY)  # queued before the step's push
    _step(tiny_model, 0)
    after = _greedy(tiny_model)
    assert after != before
    ahead.sync_weights()
    assert ahead.weight_version == 1
    early = ahead.generate(PROMPTS, 1, GREEDY)
    assert early.completion_ids == before and early.weight_version == 0  # one update stale
    late = ahead.generate(PROMPTS, 1, GREEDY)  # not prefetched: queued after the push
    assert late.completion_ids == after and late.weight_version == 1
    ahead.close()


def test_the_snapshot_is_taken_at_the_sync_not_when_pushed(tiny_model: torch.nn.Module) -> None:
    """Training goes on while the push waits behind a generation: the push must carry the
    weights of the moment sync_weights was called."""
    ahead = AheadEngine(CopyEngine(tiny_model))
    ahead.prefetch(PROMPTS, 1, GREEDY)
    _step(tiny_model, 1)
    at_sync = _greedy(tiny_model)
    ahead.sync_weights()
    _step(tiny_model, 2)  # the next update, before the push has run
    ahead.generate(PROMPTS, 1, GREEDY)
    assert ahead.generate(PROMPTS, 1, GREEDY).completion_ids == at_sync


def test_a_failed_push_stops_sampling_with_its_cause(tiny_model: torch.nn.Module) -> None:
    inner = CopyEngine(tiny_model)
    ahead = AheadEngine(inner)
    inner.fail_next_push = True
    ahead.sync_weights()
    with pytest.raises(RuntimeError, match="pushing the weights") as info:
        ahead.generate(PROMPTS, 1, GREEDY)
    assert isinstance(info.value.__cause__, OSError)
