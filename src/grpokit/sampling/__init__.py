"""Sampling a configured policy and scoring what it writes: the layer under every command.

``train``, ``evaluate``, ``preflight`` and the demo sample through a
:class:`~grpokit.sampling.sampler.Sampler` (policy, engine, sampling settings, prompt rendering
and rewards of one config), find models and checkpoints with :mod:`grpokit.models.checkpoints`
and seed and place work with :mod:`grpokit.sampling.runtime`. Its floor, and every package's,
is stated once, in tests/test_layers.py, which checks the imports against it.
"""

from __future__ import annotations

from grpokit.models.checkpoints import (
    ModelSpec,
    checkpoint_dirs,
    latest_checkpoint,
    model_dir,
    resolve_model,
    unique_labels,
)
from grpokit.sampling.runtime import resolve_device, seed_everything
from grpokit.sampling.sampler import (
    Sampled,
    Sampler,
    check_tools,
    load_model_policy,
    tool_rollout,
    torch_engine,
)
from grpokit.sampling.scoring import (
    PassSummary,
    Sample,
    ScoredBatch,
    merge_scores,
    reward_inputs,
    sample_and_score,
    summarize,
)

__all__ = [
    "ModelSpec",
    "PassSummary",
    "Sample",
    "Sampled",
    "Sampler",
    "ScoredBatch",
    "check_tools",
    "checkpoint_dirs",
    "latest_checkpoint",
    "load_model_policy",
    "merge_scores",
    "model_dir",
    "resolve_device",
    "resolve_model",
    "reward_inputs",
    "sample_and_score",
    "seed_everything",
    "summarize",
    "tool_rollout",
    "torch_engine",
    "unique_labels",
]
