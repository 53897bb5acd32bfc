"""Micro-batches sized by a token budget: the split, and an update equal to the row-sized one."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from float64_identity import UPDATE_SETTINGS, assert_same_update, updated

from grpokit.config import GRPOKitConfig
from grpokit.train.rollout_record import Rollout
from grpokit.train.trainer import GRPOTrainer

PROMPTS = [[1, 9690, 198, 2683, 314], [1, 4093, 30]]


def experience(lengths: list[int]) -> Rollout:
    g = torch.Generator().manual_seed(3)
    n = len(lengths)
    return Rollout(
        prompt_ids=[PROMPTS[i * 2 // n] for i in range(n)],
        completion_ids=[torch.randint(3, 20000, (k,), generator=g).tolist() for k in lengths],
        advantages=torch.randn(n, generator=g),
        loss_mask_rows=torch.ones(n),
    )


def test_split_respects_rows_and_budget() -> None:
    exp = experience([2, 3, 12, 1, 4, 4, 30, 2])  # prompts of 5 tokens (rows 0-3) and 3 (4-7)
    assert exp.micro_batch_rows(4) == [slice(0, 4), slice(4, 8)]
    split = exp.micro_batch_rows(4, token_budget=24)
    assert split == [slice(0, 2), slice(2, 3), slice(3, 5), slice(5, 6), slice(6, 7), slice(7, 8)]
    for rows in split:  # padded size within the budget unless the row is alone
        width = max(len(p) for p in exp.prompt_ids[rows]) + max(
            max(1, len(c)) for c in exp.completion_ids[rows]
        )
        assert (rows.stop - rows.start) * width <= 24 or rows.stop - rows.start == 1
    assert [r.stop - r.start for r in exp.micro_batch_rows(3, token_budget=10_000)] == [3, 3, 2]


def test_packed_split_counts_the_rows_own_tokens() -> None:
    """Padding-free micro-batches hold the rows' tokens, not rows x the longest: fewer of them
    for the same budget."""
    exp = experience([2, 3, 12, 1, 4, 4, 30, 2])  # own tokens 7 8 17 6 7 7 33 5
    split = exp.micro_batch_rows(4, token_budget=24, packed=True)
    assert split == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 7), slice(7, 8)]
    for rows in split:
        pairs = zip(exp.prompt_ids[rows], exp.completion_ids[rows], strict=True)
        own = sum(len(p) + len(c) for p, c in pairs)
        assert own <= 24 or rows.stop - rows.start == 1
    assert len(split) < len(exp.micro_batch_rows(4, token_budget=24))


def test_train_batch_lays_out_what_the_loss_counts() -> None:
    """A micro-batch of rows 1-2 of three: completions right-padded to the longest, the loss mask
    the product of the completion mask, the row mask (row 2 truncated and masked) and the tool
    mask (row 1's middle token is a tool message's); per-token values padded with 0 as the
    completions are; the advantages of those rows."""
    rollout = Rollout(
        prompt_ids=[[1, 2], [1, 2], [3]],
        completion_ids=[[5], [6, 7, 8], [9, 10]],
        advantages=torch.tensor([0.5, -1.0, 2.0]),
        loss_mask_rows=torch.tensor([1.0, 1.0, 0.0]),
        sampler_logps=[
            torch.tensor([-0.1]),
            torch.tensor([-0.2, -0.3, -0.4]),
            torch.tensor([-0.5, -0.6]),
        ],
        tool_mask=[[1], [1, 0, 1], [1, 1]],
    )
    batch = rollout.train_batch(slice(1, 3), pad_token_id=0)
    assert len(batch) == 2 and batch.old_logps is None and batch.ref_logps is None
    assert batch.tokens.completion_ids.tolist() == [[6, 7, 8], [9, 10, 0]]
    assert batch.loss_mask.tolist() == [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    assert batch.advantages.tolist() == [-1.0, 2.0]
    assert batch.sampler_logps is not None
    assert torch.equal(batch.sampler_logps, torch.tensor([[-0.2, -0.3, -0.4], [-0.5, -0.6, 0.0]]))
    without_tools = Rollout(**{**rollout.__dict__, "tool_mask": None, "sampler_logps": None})
    plain = without_tools.train_batch(slice(1, 3), pad_token_id=0)
    assert plain.loss_mask.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    assert plain.sampler_logps is None
    batches = rollout.train_batches(2, pad_token_id=0)
    assert [len(b) for b in batches] == [2, 1]
    assert batches[1].loss_mask.tolist() == [[0.0, 0.0]]


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_budgeted_update_equals_row_sized_update(
    make_config: Callable[..., GRPOKitConfig],
    float64: Callable[[GRPOTrainer], GRPOTrainer],
    loss_type: str,
) -> None:
    # An identity, checked in float64 (see the float64 fixture): at lr 1e-2, Adam turned float32
    # rounding into relative differences of 4e-5 here and 1.9e-4 on a CPU with AMX.
    exp = experience([2, 3, 12, 1, 4, 4, 30, 2])
    after = []
    for budget in (None, 24):
        config = make_config(
            **UPDATE_SETTINGS, loss_type=loss_type, max_tokens_per_micro_batch=budget
        )
        config.training.output_dir = f"run-{budget}"
        trainer = float64(GRPOTrainer(config, progress=False, log=lambda m: None))
        after.append(updated(trainer, exp))
    assert_same_update(*after)
