"""training.curriculum: the prompt order passes over prompts whose last group was flat, each step
keeps its prompts, and the records survive a resume."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from grpokit.config import GRPOKitConfig
from grpokit.core.curriculum import Curriculum, PromptRecord
from grpokit.data.prompts import PromptRow
from grpokit.errors import UserError
from grpokit.train.curriculum import PromptCurriculum
from grpokit.train.data_order import PromptStream
from grpokit.train.run import resume_run
from grpokit.train.trainer import GRPOTrainer

# Rewards of a set where half the prompts are flat: every completion of an "easy" topic scores
# 1, and the others score the share of the letter e (a spread).
EASY = ("apples", "rivers", "stars", "trees")
REWARD_MODULE = f"""
EASY = {EASY!r}

def half_flat(prompts, completions, topic, **columns):
    out = []
    for c, t in zip(completions, topic):
        text = c if isinstance(c, str) else c[0]["content"]
        out.append(1.0 if t in EASY else text.count("e") / max(1, len(text)))
    return out
"""


def _rows(n: int) -> list[PromptRow]:
    return [PromptRow(f"p{i}", {}, "test") for i in range(n)]


def test_the_stream_passes_over_what_keep_refuses() -> None:
    stream = PromptStream(_rows(5), seed=0, shuffle=False)
    odd = lambda index, epoch, position: index % 2 == 1  # noqa: E731
    assert stream.take_indices(2, odd) == ([1, 3], 2)  # 0 and 2 passed over
    assert (stream.epoch, stream.position) == (0, 4)
    # 4 passed over, then the next epoch: 0 and 2 passed over again.
    assert stream.take_indices(2, odd) == ([1, 3], 3)
    assert (stream.epoch, stream.position) == (1, 4)


def test_a_stream_that_keep_refuses_entirely_still_fills_the_step() -> None:
    stream = PromptStream(_rows(3), seed=0, shuffle=False)
    # All 3 prompts passed over once; then taken as they come.
    assert stream.take_indices(2, lambda *slot: False) == ([0, 1], 3)
    assert (stream.epoch, stream.position) == (1, 2)


def test_prompt_curriculum_records_groups_and_keeps_by_pool() -> None:
    c = PromptCurriculum(
        Curriculum(easy_threshold=0.5, easy_keep_prob=0.0, hard_keep_prob=1.0),
        num_prompts=6,
        seed=0,
    )
    nan = float("nan")
    # Prompts 3, 5 and 1, G = 2: all right (flat at 1), a spread (mean 0.5), no score at all.
    total = torch.tensor([1.0, 1.0, 0.0, 1.0, nan, nan])
    c.observe([3, 5, 1], total, torch.tensor([True, False, True]))
    assert c.records == {3: PromptRecord(1, 1.0, True), 5: PromptRecord(1, 0.5, False)}
    assert not c.keep(3, 0, 0)  # easy, kept with probability 0
    assert c.keep(5, 0, 0) and c.keep(0, 0, 0)  # normal; never drawn
    c.observe([5], torch.tensor([0.0, 0.0]), torch.tensor([True]))
    assert c.keep(5, 0, 1)  # hard, kept with probability 1
    c.passed_over = 3
    assert c.metrics() == {
        "curriculum/easy": 1.0,
        "curriculum/normal": 4.0,
        "curriculum/hard": 1.0,
        "curriculum/passed_over": 3.0,
    }
    assert c.metrics()["curriculum/passed_over"] == 0.0
    assert c.parse(c.state()) == c.records
    with pytest.raises(ValueError, match="prompt 9 is beyond the 6 training prompts"):
        c.parse({"9": [1, 1.0, True]})


@pytest.fixture
def curriculum_config(
    make_config: Callable[..., GRPOKitConfig], tmp_path: Path
) -> Callable[..., GRPOKitConfig]:
    (tmp_path / "half_flat.py").write_text(REWARD_MODULE)
    reward = {"type": "python", "name": "r", "function": "half_flat.py:half_flat"}

    def factory(**training: Any) -> GRPOKitConfig:
        return make_config(rewards=[reward], **training)

    return factory


def _run(cfg: GRPOKitConfig) -> tuple[GRPOTrainer, list[list[str]]]:
    """Train; the topics of each round's prompts."""
    trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    drawn: list[list[str]] = []
    take = trainer.rollouts.next

    def next_round(prompts: int, *, later_rounds: int) -> Any:
        out = take(prompts, later_rounds=later_rounds)
        drawn.append([str(row.columns["topic"]) for row in out.scored.rows])
        return out

    trainer.rollouts.next = next_round  # type: ignore[method-assign]
    trainer.train()
    return trainer, drawn


def test_flat_prompts_are_drawn_less_and_steps_keep_their_size(
    curriculum_config: Callable[..., GRPOKitConfig],
) -> None:
    # 8 prompts, 2 a step, 8 steps: two epochs' worth. Without the curriculum the 4 easy
    # (always flat) prompts take half of every epoch.
    _, plain = _run(curriculum_config(max_steps=8, output_dir="plain"))
    trainer, drawn = _run(
        curriculum_config(max_steps=8, output_dir="curriculum", curriculum={"easy_keep_prob": 0.0})
    )
    assert [len(r) for r in plain] == [len(r) for r in drawn] == [2] * 8
    assert sum(t in EASY for r in plain for t in r) == 8
    # Each easy prompt is drawn once, found flat at 1, and never again (probability 0).
    easy_draws = [t for r in drawn for t in r if t in EASY]
    assert sorted(easy_draws) == sorted(EASY)
    history = trainer.history
    flat_plain = [
        json.loads(x)["frac_reward_zero_std"]
        for x in (trainer.run_dir.parent / "plain" / "metrics.jsonl").read_text().splitlines()
    ]
    flat = [h["frac_reward_zero_std"] for h in history]
    assert sum(flat) < sum(flat_plain)
    last = history[-1]
    assert (last["curriculum/easy"], last["curriculum/hard"]) == (4.0, 0.0)
    assert last["curriculum/normal"] == 4.0
    assert sum(h["curriculum/passed_over"] for h in history) >= 4


def test_the_records_survive_a_resume(
    curriculum_config: Callable[..., GRPOKitConfig], tmp_path: Path
) -> None:
    setting = {"easy_keep_prob": 0.0, "hard_keep_prob": 0.5}
    full, full_drawn = _run(curriculum_config(max_steps=6, output_dir="full", curriculum=setting))
    cfg = curriculum_config(max_steps=6, output_dir="split", save_steps=3, curriculum=setting)
    first = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    first.total_steps = 3  # stop after the step-3 checkpoint, as a kill would
    first.train()
    saved = json.loads((tmp_path / "split" / "checkpoint-3" / "curriculum.json").read_text())
    assert {int(k) for k in saved} == set(first.curriculum.records)  # type: ignore[union-attr]
    resumed = resume_run(tmp_path / "split", progress=False)
    assert resumed.global_step == 6
    a = [json.loads(x) for x in (full.run_dir / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (resumed.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in b] == list(range(1, 7))
    keys = ("reward", "loss", "frac_reward_zero_std", "curriculum/easy", "curriculum/hard")
    for x, y in zip(a, b, strict=True):
        for key in (*keys, "curriculum/normal", "curriculum/passed_over"):
            assert x[key] == pytest.approx(y[key], rel=1e-5, abs=1e-7), (x["step"], key)


def test_a_run_too_short_for_any_prompt_to_recur_is_told_so(
    curriculum_config: Callable[..., GRPOKitConfig],
) -> None:
    said: list[str] = []
    cfg = curriculum_config(max_steps=4, output_dir="short", curriculum={})
    GRPOTrainer(cfg, progress=False, log=said.append)  # 4 steps x 2 prompts: the 8 once each
    assert any("draws 8 prompts of 8" in m and "changes nothing" in m for m in said)
    said.clear()
    GRPOTrainer(curriculum_config(max_steps=5, output_dir="long", curriculum={}), log=said.append)
    assert not any("changes nothing" in m for m in said)


def test_damaged_records_are_named(
    curriculum_config: Callable[..., GRPOKitConfig], tmp_path: Path
) -> None:
    cfg = curriculum_config(max_steps=1, output_dir="run", curriculum={})
    GRPOTrainer(cfg, progress=False, log=lambda m: None).train()
    (tmp_path / "run" / "checkpoint-1" / "curriculum.json").write_text('{"99": [1, 1.0, true]}')
    (tmp_path / "run" / "checkpoint-1" / "manifest.json").unlink()  # no checksum to catch it
    with pytest.raises(UserError, match=r"curriculum.json.*prompt 99 is beyond the 8"):
        GRPOTrainer(cfg, progress=False, log=lambda m: None, resume=True)


def test_with_dynamic_sampling_the_curriculum_sees_every_round(
    curriculum_config: Callable[..., GRPOKitConfig],
) -> None:
    # Dynamic sampling drops the flat groups and draws again; the curriculum records the groups
    # of every round, kept or dropped.
    trainer, drawn = _run(
        curriculum_config(
            max_steps=3, output_dir="both", dynamic_sampling=True, curriculum={"easy_keep_prob": 0}
        )
    )
    assert trainer.state.global_step == 3
    seen = {t for r in drawn for t in r}
    assert len(trainer.curriculum.records) == len(seen)  # type: ignore[union-attr]
    assert trainer.history[-1]["curriculum/easy"] == len(seen & set(EASY))
