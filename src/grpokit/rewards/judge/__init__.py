"""LLM-as-a-judge rewards: a rubric, one or several judges (OpenAI-compatible endpoints or an
in-process model), robust score parsing, logprob-weighted scores and a persistent cache. The
audit of a judge's noise and exploitability (``grpokit judge audit``) is in
:mod:`grpokit.rewards.audit.judge`.

Importing this module registers the reward type ``judge``.
"""

from __future__ import annotations

from grpokit.rewards.judge.config import JudgeParams, LocalJudge, OpenAIJudge
from grpokit.rewards.judge.parse import find_score, normalise, parse_score
from grpokit.rewards.judge.reward import JudgeReward, build_judge_reward
from grpokit.rewards.judge.rubric import Rubric, load_rubric
from grpokit.rewards.registry import BuildContext, register_reward

__all__ = [
    "JudgeParams",
    "JudgeReward",
    "LocalJudge",
    "OpenAIJudge",
    "Rubric",
    "build_judge_reward",
    "find_score",
    "load_rubric",
    "normalise",
    "parse_score",
]


def build(params: JudgeParams, ctx: BuildContext) -> JudgeReward:
    """Registry builder for ``type: judge``."""
    return build_judge_reward(params, ctx.base_dir, ctx.run_dir)


register_reward("judge", JudgeParams, build, max_value=1.0)
