"""Generation engines behind one small interface (:class:`RolloutEngine`)."""

from __future__ import annotations

from grpokit.rollout.base import FinishReason, RolloutBatch, RolloutEngine, SamplingParams
from grpokit.rollout.torch_engine import TorchEngine

__all__ = ["FinishReason", "RolloutBatch", "RolloutEngine", "SamplingParams", "TorchEngine"]
