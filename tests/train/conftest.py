"""A tiny training set-up: the tiny random model, a prompt file and a python reward."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpokit.config import GRPOKitConfig, load_config

REWARD_MODULE = '''
def letter_e(prompts, completions, **columns):
    """Share of the letter e among the completion's characters: a dense, learnable signal."""
    out = []
    for c in completions:
        text = c if isinstance(c, str) else c[0]["content"]
        out.append(text.count("e") / max(1, len(text)))
    return out


def constant(prompts, completions, **columns):
    """The same reward for every completion: no group has anything to learn from."""
    return [1.0 for _ in completions]
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


@pytest.fixture
def float64(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], Any]:
    """cast(x) -> x in float64 (a GRPOTrainer or a model), for tests of identities; see
    float64_identity.py."""
    from float64_identity import rms_norm_in_input_precision, to_float64
    from transformers.models.llama import modeling_llama

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", rms_norm_in_input_precision)
    return to_float64
