"""A tiny training set-up: the tiny random model, a prompt file and a python reward."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from grpokit.config import GRPOKitConfig, load_config

if TYPE_CHECKING:
    import torch

REWARD_MODULE = '''
def letter_e(prompts, completions, **columns):
    """Share of the letter e among the completion's characters: a dense, learnable signal."""
    out = []
    for c in completions:
        text = c if isinstance(c, str) else c[0]["content"]
        out.append(text.count("e") / max(1, len(text)))
    return out
'''


@pytest.fixture
def make_config(tmp_path: Path, tiny_model_dir: Path) -> Callable[..., GRPOKitConfig]:
    """factory(**training overrides, model=..., rewards=...) -> a loaded config in tmp_path."""
    (tmp_path / "my_rewards.py").write_text(REWARD_MODULE)
    prompts = [
        {"prompt": f"Say something about {w}.", "topic": w}
        for w in ["apples", "rivers", "stars", "trees", "music", "bread", "snow", "cities"]
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    (tmp_path / "heldout.jsonl").write_text(
        "".join(
            json.dumps({"prompt": f"Tell me about {w}.", "topic": w}) + "\n"
            for w in ["sea", "wind"]
        )
    )

    def factory(
        model: dict[str, Any] | None = None, rewards: list[Any] | None = None, **training: Any
    ) -> GRPOKitConfig:
        doc = {
            "model": {"name_or_path": str(tiny_model_dir), **(model or {})},
            "data": {
                "train": "train.jsonl",
                "heldout": "heldout.jsonl",
                "system_prompt": "You are terse.",
            },
            "rewards": rewards
            or [{"type": "python", "name": "e", "function": "my_rewards.py:letter_e"}],
            "training": {
                "learning_rate": 1e-3,
                "num_generations": 4,
                "per_device_train_batch_size": 4,
                "gradient_accumulation_steps": 2,
                "max_completion_length": 8,
                "max_steps": 2,
                "seed": 0,
                "report_to": ["none"],
                "output_dir": "run",
                **training,
            },
        }
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(doc))
        return load_config(path)

    return factory


def _rms_norm_in_float64(self: Any, hidden: torch.Tensor) -> torch.Tensor:
    """Llama's RMSNorm, computed in float64 for float64 inputs (transformers' computes in
    float32 whatever the input)."""
    import torch

    dtype = torch.promote_types(hidden.dtype, torch.float32)
    h = hidden.to(dtype)
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * normed.to(hidden.dtype)


@pytest.fixture
def float64(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], Any]:
    """cast(x) -> x in float64, for tests of identities: x a GRPOTrainer (its policy and
    reference are cast) or a model.

    Two computations that are equal in exact arithmetic (one micro-batch split or another, one
    process or two, chunked or not) differ in float32 by rounding whose size depends on the CPU's
    kernels, and Adam turns a gradient entry that is zero up to rounding into a step of +-lr: a
    float32 tolerance that holds on one CPU fails on another. In float64 the rounding is about
    1e-16, so a tolerance of 1e-9 has room on any CPU and still catches a real difference.
    transformers' RMSNorm computes in float32 even for float64 inputs, which would leave float32
    rounding (in the backward, where it depends on the batch layout): it is replaced by the same
    formula in the input's precision.
    """
    import torch
    from transformers.models.llama import modeling_llama

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", _rms_norm_in_float64)

    def cast(x: Any) -> Any:
        if isinstance(x, torch.nn.Module):
            return x.double()
        x.policy.model.double()
        if x.policy.reference is not None:
            x.policy.reference.double()
        return x

    return cast
