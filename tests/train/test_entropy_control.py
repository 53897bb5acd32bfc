"""Entropy control through the trainer on the tiny model: top_entropy_quantile trains the
high-entropy tokens, the bonus moves the entropy, the adaptive coefficient steps and resumes."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from grpokit.config import GRPOKitConfig
from grpokit.train.trainer import GRPOTrainer


def _train(cfg: GRPOKitConfig) -> tuple[Path, list[dict[str, float]]]:
    result = GRPOTrainer(cfg, progress=False, log=lambda m: None).train()
    lines = (result.run_dir / "metrics.jsonl").read_text().splitlines()
    return result.run_dir, [json.loads(x) for x in lines]


def test_high_entropy_tokens_and_adaptive_bonus_train_and_log(
    make_config: Callable[..., GRPOKitConfig],
) -> None:
    # A target above any entropy: the controller raises the coefficient by delta every step
    # (from 0.01: 0.02, 0.03, 0.04), and it is applied from the second step on.
    cfg = make_config(
        max_steps=3,
        save_steps=3,
        top_entropy_quantile=0.2,
        use_adaptive_entropy=True,
        entropy_coef=0.01,
        entropy_coef_delta=0.01,
        entropy_target=100.0,
    )
    run_dir, lines = _train(cfg)
    assert [x["entropy_coef"] for x in lines] == pytest.approx([0.02, 0.03, 0.04])
    for x in lines:
        assert math.isfinite(x["loss"]) and math.isfinite(x["grad_norm"]) and x["grad_norm"] > 0
        # About a fifth of the tokens (ties at the threshold kept), the high-entropy ones.
        assert 0.2 <= x["entropy/trained_frac"] < 0.4
        assert x["entropy/trained"] > x["entropy"]
        assert "entropy/trained_sum" not in x
    state = json.loads((run_dir / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["entropy_coef"] == pytest.approx(0.04)  # a resume continues the controller
    assert state["last_entropy"] == pytest.approx(lines[-1]["entropy/trained"])


def test_the_bonus_raises_the_entropy_and_off_changes_nothing(
    make_config: Callable[..., GRPOKitConfig],
) -> None:
    """The same run three times: with a bonus (+1), with a penalty (-1), without. After one
    update the entropy measured at step 2 is ordered by the coefficient's sign."""
    entropy = {}
    for coef in (1.0, -1.0, 0.0):
        _, lines = _train(make_config(entropy_coef=coef, learning_rate=1e-2, output_dir=f"c{coef}"))
        entropy[coef] = lines[1]["entropy"]
        assert ("entropy_coef" in lines[0]) == (coef != 0.0)
        assert ("entropy/trained_frac" in lines[0]) == (coef != 0.0)
    assert entropy[1.0] > entropy[0.0] > entropy[-1.0]
