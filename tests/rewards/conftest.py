"""A tiny reward model for the reward_model tests.

- ``tiny_classifier_dir`` (session): a 2-layer, width-64 ``LlamaForSequenceClassification``
  (one label, seed 0, randomly initialised) with the real SmolLM2 tokenizer and chat template;
  its config's ``pad_token_id`` is set. Do not write into it.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_classifier_dir(
    tmp_path_factory: pytest.TempPathFactory, embedded_model_path: Path
) -> Path:
    from grpokit.models.tiny import make_tiny_classifier_dir

    return make_tiny_classifier_dir(
        tmp_path_factory.mktemp("tiny-classifier"), seed=0, tokenizer_dir=embedded_model_path
    )
