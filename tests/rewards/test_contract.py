"""The typed contracts: every reward is a Reward (required_columns, evaluate, close, TRL's call),
plain functions are wrapped into one, and every rollout engine declares sync_weights."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from grpokit.rewards import BuildContext, RewardSpec, build_reward_set, reward_types
from grpokit.rewards._base import FunctionReward, Reward, as_reward
from grpokit.rewards.registry import get_reward_type

# The smallest parameters that build each type offline (judge and reward_model need a server or
# a model: their classes are checked below instead).
MINIMAL: dict[str, dict[str, Any]] = {
    "xml_format": {},
    "tags_present": {},
    "regex_match": {"pattern": "x"},
    "json_schema": {"schema": {"type": "object"}},
    "math_answer": {},
    "code_tests": {},
    "soft_overlong_punishment": {"max_completion_len": 8, "soft_punish_cache": 2},
    "length_penalty": {"free_length": 4},
    "repetition_penalty": {},
    "logic_tree_depth": {},
    "logic_tree_quality": {},
    "python": {"function": "user_rewards.py:plain"},
    "checklist": {"items": [{"name": "x", "regex": "x"}]},
    "environment": {},
}


@pytest.fixture()
def ctx(tmp_path: Path) -> BuildContext:
    (tmp_path / "user_rewards.py").write_text(
        textwrap.dedent(
            """
            CLOSED = []

            def plain(prompts, completions, **columns):
                return [1.0 for _ in completions]

            class Reporting:
                __name__ = "reporting"

                def __init__(self):
                    self.last_metrics = {}

                def __call__(self, prompts, completions, **columns):
                    self.last_metrics = {"mine/calls": float(len(completions))}
                    return [0.5] * len(completions)

                def close(self):
                    CLOSED.append(True)

            reporting = Reporting()
            """
        ),
        encoding="utf-8",
    )
    return BuildContext(base_dir=tmp_path, run_dir=None, seed=0)


def test_every_registered_type_is_listed_here() -> None:
    assert set(reward_types()) == set(MINIMAL) | {"judge", "reward_model"}


@pytest.mark.parametrize("type_name", sorted(MINIMAL))
def test_every_built_reward_is_a_reward(type_name: str, ctx: BuildContext) -> None:
    reward_type = get_reward_type(type_name)
    built = reward_type.build(reward_type.params_model.model_validate(MINIMAL[type_name]), ctx)
    reward = as_reward(built)
    assert isinstance(reward, Reward)
    assert isinstance(reward.required_columns, frozenset)
    # What a call reports comes back in its RewardResult: nothing is kept on the reward.
    assert not [name for name in vars(reward) if name.startswith("last_")]
    reward.close()
    reward.close()  # twice is harmless


def test_judge_and_reward_model_classes_are_rewards() -> None:
    from grpokit.rewards.builtin.reward_model import RewardModelReward
    from grpokit.rewards.judge.reward import JudgeReward

    assert issubclass(JudgeReward, Reward)
    assert issubclass(RewardModelReward, Reward)


def test_a_plain_function_is_wrapped_and_its_extras_are_forwarded(ctx: BuildContext) -> None:
    spec = RewardSpec.model_validate({"type": "python", "function": "user_rewards.py:reporting"})
    reward_set = build_reward_set([spec], ctx)
    scores = reward_set(["p", "q"], ["a", "b"], {})
    assert scores.per_function.flatten().tolist() == [0.5, 0.5]
    assert scores.metrics["mine/calls"] == 2.0  # the object's own last_metrics
    reward_set.close()  # reaches the object's own close()
    from grpokit.rewards.builtin.python_fn import load_function

    plain = load_function("user_rewards.py:plain", ctx.base_dir)
    assert plain.__globals__["CLOSED"] == [True]


def test_as_reward_keeps_rewards_and_wraps_callables() -> None:
    def brevity(prompts: Any, completions: list[str], **columns: Any) -> list[float]:
        return [-len(c) / 10 for c in completions]

    wrapped = as_reward(brevity)
    assert isinstance(wrapped, FunctionReward) and wrapped.__name__ == "brevity"
    assert wrapped(prompts=["p"], completions=["abc"]) == [-0.3]
    assert as_reward(wrapped) is wrapped
    with pytest.raises(TypeError, match="callable"):
        as_reward(42)  # type: ignore[arg-type]


def test_every_engine_declares_sync_weights() -> None:
    from grpokit.rollout.base import RolloutEngine
    from grpokit.rollout.torch_engine import TorchEngine
    from grpokit.rollout.vllm_engine import VLLMEngine
    from grpokit.train.fsdp import GatheredEngine

    for engine in (TorchEngine, VLLMEngine, GatheredEngine):
        assert callable(getattr(engine, "sync_weights", None)), engine
    assert "sync_weights" in RolloutEngine.__dict__
