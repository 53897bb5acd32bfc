"""Shared fixtures: tiny randomly initialised models with the real SmolLM2 tokenizer, and the
converted embedded model.

- ``embedded_model_path`` (session): directory of the converted SmolLM2-135M-Instruct (converted
  once per machine into the grpokit cache, about 30 s the first time).
- ``tiny_model_dir`` (session): a 2-layer, width-64 ``LlamaForCausalLM`` (seed 0) with the
  SmolLM2 tokenizer and chat template; loads in well under a second. Do not write into it.
- ``tiny_model_factory`` (session): ``factory(seed=1, **llama_config_overrides) -> Path`` for
  other tiny models (cached per argument set within the session).
- ``vllm_tiny_model_dir`` (session): the tiny model shaped for vLLM's CPU attention (head size
  32: 2 heads, 1 KV head; the default's 16 is below what it takes), seed 1, with weights drawn
  wider (``initializer_range`` 0.3) so that sampled tokens vary.
- ``tiny_tokenizer``: a fresh tokenizer of ``tiny_model_dir`` per test (tests may change it).
- ``tiny_model``: a fresh ``LlamaForCausalLM`` from ``tiny_model_dir`` per test, in eval mode.

Torch runs single-threaded in tests (``GRPOKIT_TEST_THREADS`` changes it): the models are tiny,
and on a busy machine with few cores, intra-op threads waiting on each other made the rollout
tests about 30 times slower than one thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from grpokit.hub.embedded import embedded_model_dir

if TYPE_CHECKING:  # transformers is imported by the fixtures, not by every test session
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def pytest_configure(config: pytest.Config) -> None:
    import torch

    torch.set_num_threads(int(os.environ.get("GRPOKIT_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def embedded_model_path() -> Path:
    return embedded_model_dir()


@pytest.fixture(scope="session")
def tiny_model_factory(
    tmp_path_factory: pytest.TempPathFactory, embedded_model_path: Path
) -> Callable[..., Path]:
    from grpokit.models.tiny import make_tiny_model_dir

    made: dict[str, Path] = {}

    def factory(seed: int = 0, **config_overrides: Any) -> Path:
        key = repr((seed, sorted(config_overrides.items())))
        if key not in made:
            out = tmp_path_factory.mktemp(f"tiny-model-seed{seed}")
            made[key] = make_tiny_model_dir(
                out, seed=seed, tokenizer_dir=embedded_model_path, **config_overrides
            )
        return made[key]

    return factory


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_factory: Callable[..., Path]) -> Path:
    return tiny_model_factory(seed=0)


VLLM_TINY = {"num_attention_heads": 2, "num_key_value_heads": 1, "initializer_range": 0.3}


@pytest.fixture(scope="session")
def vllm_tiny_model_dir(tiny_model_factory: Callable[..., Path]) -> Path:
    return tiny_model_factory(seed=1, **VLLM_TINY)


@pytest.fixture
def tiny_tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(tiny_model_dir)
    return tokenizer


@pytest.fixture
def tiny_model(tiny_model_dir: Path) -> PreTrainedModel:
    import torch
    from transformers import AutoModelForCausalLM

    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32
    )
    model.eval()
    return model
