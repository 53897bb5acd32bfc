"""A run whose steps have no learning signal (every group's rewards equal) says so after
NO_SIGNAL_STEPS steps in a row, once, with preflight's advice when run as `grpokit train`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

from click.testing import CliRunner

from grpokit.cli import main
from grpokit.config import GRPOKitConfig
from grpokit.sampling import ScoredBatch
from grpokit.train.no_signal import NO_SIGNAL_STEPS, NoSignalWatch
from grpokit.train.trainer import GRPOTrainer

# The tiny random model never writes the tags: every reward 0, the cold start.
COLD = [{"type": "xml_format", "name": "format", "tags": ["answer"]}]


def test_the_watch_fires_once_a_streak_and_counts_optimizer_steps() -> None:
    watch = NoSignalWatch(steps=3)
    batch = cast(ScoredBatch, object())
    # Rounds of num_iterations = 2 optimizer steps each.
    assert not watch.update(True, batch, steps=2)
    assert watch.update(True, batch, steps=2)  # steps 3-4: the third flat step
    assert not watch.update(True, batch, steps=2)  # said once
    assert watch.streak == 6 and len(watch.batches) == 3
    assert not watch.update(False, batch, steps=2)
    assert watch.streak == 0 and watch.batches == []
    assert not watch.update(True, batch, steps=1) and not watch.update(True, batch, steps=1)
    assert watch.update(True, batch, steps=1)  # a new streak warns again


def test_a_cold_start_run_warns_after_three_flat_steps(
    make_config: Callable[..., GRPOKitConfig],
) -> None:
    lines: list[str] = []
    cfg = make_config(rewards=COLD, max_steps=NO_SIGNAL_STEPS + 2)
    GRPOTrainer(cfg, progress=False, log=lines.append).train()
    warnings = [x for x in lines if x.startswith("[no signal]")]
    assert len(warnings) == 1, lines
    (warning,) = warnings
    assert warning.startswith(f"[no signal] steps 1-{NO_SIGNAL_STEPS}: ")
    assert "all completions got the same reward" in warning
    assert "the gradient are 0" in warning and "`grpokit preflight CONFIG`" in warning
    # Said after the third step's line, not before.
    assert lines.index(warning) > next(
        i for i, x in enumerate(lines) if x.startswith(f"step {NO_SIGNAL_STEPS}/")
    )


def test_a_run_with_signal_says_nothing(make_config: Callable[..., GRPOKitConfig]) -> None:
    lines: list[str] = []
    GRPOTrainer(make_config(max_steps=NO_SIGNAL_STEPS), progress=False, log=lines.append).train()
    assert lines and not any("[no signal]" in x for x in lines)


def test_grpokit_train_gives_preflight_s_advice_on_the_run_s_samples(
    make_config: Callable[..., GRPOKitConfig], tmp_path: Path
) -> None:
    make_config(rewards=COLD, max_steps=NO_SIGNAL_STEPS)
    result = CliRunner().invoke(main, ["train", str(tmp_path / "config.yaml")])
    assert result.exit_code == 0, result.output
    warning = result.output[result.output.index("[no signal]") :]
    assert "grpokit preflight's verdict on their samples:" in warning
    # preflight's reason and its cold-start advice, with the numbers of the three steps'
    # 3 x 2 groups of 4.
    assert "100% of the 6 groups of 4 have equal total rewards" in warning
    assert "format 0/24 at its maximum" in warning
    assert "  - SFT warm-start: `grpokit sft CONFIG --data demos.jsonl`" in warning
