"""The monitors against noise: silent on healthy runs at the demo's noise level, quick to fire on a
simulated hack, and a false-alarm rate under the configured target on stationary noise.

Measured with these simulations (tests/monitor/synthetic_metrics.py), default settings:
healthy runs of 80 steps, learning or flat: no alert in any seed. Hack at step 30, 30 runs:
repetition fired 3 steps after the onset in every run; length_reward after 7-11 steps in 29;
reward_saturation after 6-13 steps in 24 and not within 25 steps in 6: the answer rate of 2
prompts a step has a standard deviation of about 0.2, so a fall from 0.5 to 0.05 stands out of
it only after about a dozen steps, and not always. With 4 prompts a step it fired after 7-13
steps in all 30 runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pytest
from synthetic_metrics import REWARD_MAX, REWARDS, demo_metrics

from grpokit.core.stats import spearman
from grpokit.monitor import Alert, MonitorConfig, MonitorSet


def alerts_of(rows: Iterable[Mapping[str, object]], config: MonitorConfig) -> list[Alert]:
    monitors = MonitorSet(config, REWARDS, REWARD_MAX)
    return [a for step, row in enumerate(rows, start=1) for a in monitors.update(step, row)]


# ---- (a) healthy runs ------------------------------------------------------------------------


@pytest.mark.parametrize("answer", [(0.40, 0.62), (0.5, 0.5), (0.25, 0.3)])
@pytest.mark.parametrize("seed", range(4))
def test_healthy_runs_at_demo_noise_give_no_alert(seed: int, answer: tuple[float, float]) -> None:
    rows = demo_metrics(seed, steps=80, answer=answer)
    assert [str(a) for a in alerts_of(rows, MonitorConfig())] == []


def _old_saturation_rule_fires(rows: list[dict[str, float]]) -> bool:
    """The rule before the noise test: format's 3-step mean >= 0.95 while the answer's 10-step
    window has Spearman <= -0.6 and its first third 0.05 above its last third."""
    for end in range(10, len(rows) + 1):
        fmt = [r["pass_rate/format"] for r in rows[end - 3 : end]]
        ans = [r["rewards/answer/mean"] for r in rows[end - 10 : end]]
        falling = (
            spearman(list(range(10)), ans) <= -0.6 and np.mean(ans[:3]) - np.mean(ans[-3:]) >= 0.05
        )
        if np.mean(fmt) >= 0.95 and falling:
            return True
    return False


def test_the_old_short_window_rule_cried_wolf_on_the_same_runs() -> None:
    # The alert the demo raised on a healthy run ("answer fell over the last 10 steps"): a
    # 10-step trend on a metric whose step-to-step noise is larger than the trend.
    runs = [demo_metrics(seed, steps=60) for seed in range(10)]
    assert sum(_old_saturation_rule_fires(rows) for rows in runs) >= 3
    assert not any(
        a.rule == "reward_saturation" for r in runs for a in alerts_of(r, MonitorConfig())
    )


# ---- (b) a hack ------------------------------------------------------------------------------

HACK_AT = 30


def _delays(runs: int, prompts: int) -> dict[str, list[int]]:
    """Steps from the onset to each rule's first alert, over seeded hacked runs."""
    delays: dict[str, list[int]] = {}
    for seed in range(runs):
        rows = demo_metrics(seed, steps=HACK_AT + 25, hack_at=HACK_AT, prompts=prompts)
        alerts = alerts_of(rows, MonitorConfig())
        assert [str(a) for a in alerts if a.step < HACK_AT] == []
        first: dict[str, int] = {}
        for a in alerts:
            first.setdefault(a.rule, a.step - HACK_AT)
        for rule, delay in first.items():
            delays.setdefault(rule, []).append(delay)
    return delays


def test_a_hack_fires_within_the_stated_steps() -> None:
    runs = 30
    delays = _delays(runs, prompts=2)
    # (rule, steps after the onset, share of runs that must fire within them)
    for rule, within, share in [("repetition", 4, 1.0), ("length_reward", 12, 0.9),
                                ("reward_saturation", 14, 0.75)]:  # fmt: skip
        assert sum(d <= within for d in delays[rule]) >= share * runs, (rule, delays[rule])
    # With 4 prompts a step the answer rate is less noisy, and its fall is never missed.
    four = _delays(runs, prompts=4)["reward_saturation"]
    assert len(four) == runs and max(four) <= 14


def test_alerts_state_their_evidence() -> None:
    alerts = alerts_of(demo_metrics(0, steps=HACK_AT + 25, hack_at=HACK_AT), MonitorConfig())
    by_rule = {a.rule: a.message for a in reversed(alerts)}
    sat = by_rule["reward_saturation"]
    assert "'format' is saturated" in sat and "'answer'" in sat
    assert " df beyond " in sat and "false alarms per 100 steps" in sat
    assert "t = -" in sat and "t = +" in by_rule["length_reward"]
    assert "repeated n-gram share rose" in by_rule["repetition"]


# ---- (c) calibration -------------------------------------------------------------------------

# Every change rule with its effect thresholds at (almost) nothing, so that the noise test alone
# decides, and a loose target that a few hundred runs can measure.
CALIBRATION = MonitorConfig.model_validate(
    {
        "false_alarm_rate": 0.5,
        "horizon_steps": 100,
        "length_reward": {"min_corr": 1e-9, "min_rel_growth": 1e-9},
        "repetition": {"max_increase": 1e-9, "min_distinct_ratio": 1 - 1e-9},
        "kl": {"max_kl": 1e9, "jump_ratio": 1 + 1e-9, "jump_min": 0.0},
        "entropy": {"floor": 0.0, "min_frac_of_early": 1 - 1e-9},
        "saturation": {"min_corr": 1e-9, "min_drop": 1e-9},
        "group_dominance": {"enabled": False},
        "heldout": {"enabled": False, "watch": ["answer"]},
        "divergence": {"min_drop": 1e-9, "min_rise": 1e-9},
    }
)


def _stationary(rng: np.random.Generator, steps: int) -> list[dict[str, float]]:
    """Stationary noise in every metric; the answer rate as the demo's (2 prompts x 8 samples,
    rho 0.3 around 0.5); the reward a steady climb (the length rule needs a rising reward)."""
    p = rng.beta(1.17, 1.17, size=(steps, 2))
    answer = rng.binomial(8, p).sum(axis=1) / 16
    z = rng.normal(size=(5, steps))
    return [
        {
            "reward": 0.01 * i,
            "pass_rate/format": 1.0,
            "rewards/format/mean": 1.0,
            "rewards/answer/mean": float(answer[i]),
            "completions/mean_length": 100 + 3 * z[0, i],
            "completions/repeated_ngram_frac": 0.1 + 0.015 * z[1, i],
            "completions/distinct_2": 0.6 + 0.03 * z[2, i],
            "kl": 1.0 + 0.1 * z[3, i],
            "entropy": 0.5 + 0.03 * z[4, i],
        }
        for i in range(steps)
    ]


def test_false_alarm_rate_stays_under_the_target_on_stationary_noise() -> None:
    rng = np.random.default_rng(11)
    runs, steps = 120, CALIBRATION.horizon_steps
    fired: dict[str, int] = {}
    for _ in range(runs):
        for rule in {a.rule for a in alerts_of(_stationary(rng, steps), CALIBRATION)}:
            fired[rule] = fired.get(rule, 0) + 1
    assert set(fired) <= {"length_reward", "repetition", "kl_jump", "entropy_collapse",
                          "reward_saturation", "reward_divergence"}  # fmt: skip
    for rule, count in fired.items():
        assert count / runs <= CALIBRATION.false_alarm_rate, (rule, count)
