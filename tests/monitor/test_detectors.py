from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Mapping

import pytest

from grpokit.core.stats import student_t_quantile
from grpokit.monitor import Alert, MonitorConfig, MonitorSet
from grpokit.monitor.config import (
    DivergenceRule,
    EntropyRule,
    GroupDominanceRule,
    HeldoutRule,
    KLRule,
    LengthRewardRule,
    RepetitionRule,
    SaturationRule,
)
from grpokit.monitor.detectors import (
    Detector,
    DivergenceDetector,
    EntropyDetector,
    Episode,
    GroupDominanceDetector,
    HeldoutDetector,
    KLDetector,
    LengthRewardDetector,
    RepetitionDetector,
    SaturationDetector,
)
from grpokit.monitor.series import ChangeTest, ema, shift, step_noise, trend

REARM = 3


def run(detector: Detector | MonitorSet, rows: Iterable[Mapping[str, object]]) -> list[Alert]:
    alerts: list[Alert] = []
    for step, row in enumerate(rows, start=1):
        alerts.extend(detector.update(step, row))
    return alerts


def fired(alerts: list[Alert]) -> list[tuple[str, int]]:
    return [(a.rule, a.step) for a in alerts]


# ---- helpers -------------------------------------------------------------------------------------


def test_trend_hand_computed_and_zero_for_a_constant_series() -> None:
    assert trend([1, 4, 9, 16]) == pytest.approx(1.0)
    assert trend([4, 3, 2, 1]) == pytest.approx(-1.0)
    assert trend([1.0, 3.0, 2.0]) == pytest.approx(0.5)
    # The correlation is undefined (core.stats gives NaN); a monitor reads it as no trend.
    assert trend([5, 5, 5]) == 0.0
    assert trend([7.0]) == 0.0


def test_ema_bias_corrected_and_skips_missing() -> None:
    out = ema([1.0, None, 3.0], alpha=0.5)
    # (0.5*1) / 0.5 = 1; then (0.25 + 1.5) / 0.75
    assert out[0] == pytest.approx(1.0)
    assert out[1] is None
    assert out[2] == pytest.approx(1.75 / 0.75)


def test_episode_fires_once_and_rearms_after_false_run() -> None:
    ep = Episode(rearm=2)
    seq = [True, True, False, True, False, False, True, True]
    assert [ep.check(c) for c in seq] == [True, False, False, False, False, False, True, False]


def test_episode_holds_while_the_change_stays_large() -> None:
    # (significant and large, large): once fired, a large change that is no longer significant
    # (its own steps now widen the noise) keeps the episode; two small checks re-arm it.
    ep = Episode(rearm=2)
    seq = [(True, True), (False, True), (False, True), (True, True), (False, False),
           (False, False), (True, True)]  # fmt: skip
    assert [ep.check(c, h) for c, h in seq] == [True, False, False, False, False, False, True]


def test_step_noise_and_shift_hand_computed() -> None:
    # 1 2 4 4 5 around its least-squares line: sxx 10, sxy 10, syy 10.8, residual sum of
    # squares 10.8 - 10^2/10 = 0.8 on 3 df -> sigma sqrt(0.8 / 3) = 0.516398.
    sigma, df = step_noise([1.0, 2.0, 4.0, 4.0, 5.0]) or (0.0, 0)
    assert (sigma, df) == (pytest.approx(0.516398, abs=1e-6), 3)
    # A straight line is trend, not noise.
    assert step_noise([3.0, 5.0, 7.0, 9.0]) == (0.0, 2)
    assert step_noise([1.0, 2.0]) is None
    # Means 1.5 -> 5 with se = sigma * sqrt(1/2 + 1/2): t = 3.5 / 0.516398 = 6.7777.
    s = shift([1.0, 2.0], [4.0, 6.0], [1.0, 2.0, 4.0, 4.0, 5.0])
    assert s is not None and (s.before, s.after, s.df) == (1.5, 5.0, 3)
    assert s.t == pytest.approx(6.7777, abs=1e-4)
    flat = shift([1.0, 1.0], [2.0], [1.0, 1.0, 1.0])
    assert flat is not None and flat.t == math.inf
    assert shift([1.0], [2.0], [1.0, 2.0]) is None


def test_change_test_level_from_the_false_alarm_target() -> None:
    test = ChangeTest(false_alarm_rate=0.01, horizon_steps=100, noise_window=50)
    assert test.alpha == pytest.approx(1e-4)
    assert test.split(2).alpha == pytest.approx(5e-5)
    assert test.critical(30) == pytest.approx(student_t_quantile(1 - 1e-4, 30))
    s = shift([0.0] * 5, [1.0] * 3, [0.0, 0.1, -0.1, 0.05, -0.05] * 3)
    assert s is not None and s.df == 13 and test.rose(s) and not test.fell(s)
    # the same shift on 3 df of noise is not enough: t 15.7 against 22.2
    s = shift([0.0] * 5, [1.0] * 3, [0.0, 0.1, -0.1, 0.05, -0.05])
    assert s is not None and not test.rose(s)
    assert "false alarms per 100 steps" in test.evidence(s)
    assert ChangeTest.of(MonitorConfig(horizon_steps=50)).alpha == pytest.approx(2e-4)


# ---- length grows while the reward rises -------------------------------------------------------


def test_length_reward_fires_once_on_joint_rise() -> None:
    rows = [{"completions/mean_length": 40 + 3 * t, "reward": 0.1 + 0.02 * t} for t in range(1, 21)]
    alerts = run(LengthRewardDetector(LengthRewardRule(), REARM), rows)
    # The noise comes from the steps before the 10-step window (at least 3 of them): step 13.
    assert fired(alerts) == [("length_reward", 13)]
    # halves of steps 4-13: lengths 52 .. 64 (mean 58), 67 .. 79 (mean 73); a straight line
    # has no noise around its trend, so the test passes and the 26% growth decides
    assert alerts[0].value == pytest.approx(15 / 58)
    assert "58 -> 73 tokens, steps 4-8 -> 9-13" in alerts[0].message
    assert "no step-to-step noise" in alerts[0].message


@pytest.mark.parametrize(
    "rows",
    [
        # length grows, reward only noise
        [
            {"completions/mean_length": 40 + 3 * t, "reward": 0.5 + 0.01 * (-1) ** t}
            for t in range(1, 31)
        ],
        # reward rises, length steady
        [{"completions/mean_length": 60 + (t % 3), "reward": 0.1 + 0.02 * t} for t in range(1, 31)],
    ],
)
def test_length_reward_silent_without_joint_trend(rows: list[dict[str, float]]) -> None:
    assert run(LengthRewardDetector(LengthRewardRule(), REARM), rows) == []


# ---- repetition ------------------------------------------------------------------------------------


def test_repetition_fires_on_repeated_ngrams() -> None:
    rows = [
        {"completions/repeated_ngram_frac": 0.05 if t <= 8 else 0.4, "completions/distinct_2": 0.8}
        for t in range(1, 21)
    ]
    alerts = run(RepetitionDetector(RepetitionRule(), REARM), rows)
    # step 10: mean(0.05, 0.4, 0.4) = 0.283, 0.233 above the early 0.05
    assert fired(alerts) == [("repetition", 10)]
    assert alerts[0].value == pytest.approx(0.85 / 3)


def test_repetition_fires_on_falling_distinct_2() -> None:
    rows = [
        {"completions/repeated_ngram_frac": 0.05, "completions/distinct_2": 0.8 if t <= 8 else 0.3}
        for t in range(1, 21)
    ]
    alerts = run(RepetitionDetector(RepetitionRule(), REARM), rows)
    # step 9: mean(0.8, 0.8, 0.3) = 0.63 >= 0.48; step 10: 0.467 < 0.6 * 0.8
    assert fired(alerts) == [("repetition", 10)]
    assert "distinct-2 fell" in alerts[0].message


def test_repetition_silent_on_noise() -> None:
    rng = random.Random(0)
    rows = [
        {
            "completions/repeated_ngram_frac": 0.05 + rng.uniform(-0.03, 0.03),
            "completions/distinct_2": 0.8 + rng.uniform(-0.05, 0.05),
        }
        for _ in range(60)
    ]
    assert run(RepetitionDetector(RepetitionRule(), REARM), rows) == []


# ---- KL ---------------------------------------------------------------------------------------------


def test_kl_jump_then_high() -> None:
    kl = [0.02] * 10 + [0.3] + [0.6] * 10
    alerts = run(KLDetector(KLRule(), REARM), [{"kl": v} for v in kl])
    # the jump holds for 2 steps (the smaller, 0.3, is 15x the median) when KL passes 0.5
    assert fired(alerts) == [("kl_high", 12), ("kl_jump", 12)]
    assert alerts[1].value == pytest.approx(0.6)
    assert "15.0x" in alerts[1].message and "stayed at 0.3 or more for 2 steps" in alerts[1].message
    once = run(KLDetector(KLRule(jump_persist_steps=1), REARM), [{"kl": v} for v in kl])
    assert fired(once) == [("kl_jump", 11), ("kl_high", 12)]


def test_a_one_step_kl_spike_is_not_a_jump() -> None:
    # KL is a mean over a step's few prompts: 0 while groups are solved, one unusual prompt
    # gives a spike that is gone the next step (as in a healthy arithmetic run)
    kl = [0.0, 0.0, 0.001, 0.0, 0.0, 0.0, 0.0, 0.001, 0.0, 0.013, 0.015, 0.0, 0.082, 0.0, 0.003]
    assert run(KLDetector(KLRule(), REARM), [{"kl": v} for v in kl]) == []


def test_kl_high_refires_after_recovery() -> None:
    kl = [0.7, 0.8, 0.1, 0.1, 0.1, 0.9]
    alerts = run(KLDetector(KLRule(jump_min_history=5), REARM), [{"kl": v} for v in kl])
    assert fired(alerts) == [("kl_high", 1), ("kl_high", 6)]


def test_kl_jump_needs_to_stand_out_of_the_noise() -> None:
    # A spiky KL: the median of the 10 steps before is 0.004 (floored at 0.005), so 0.45 is a
    # 90x jump, but steps that swing between 0.002 and 0.22 keep it (t = 4.3 on 8 df) short of
    # the bar (6.44 for 1e-4 one-sided).
    spiky = [0.003, 0.2, 0.004, 0.003, 0.22, 0.002, 0.004, 0.19, 0.003, 0.21]
    high = [0.45, 0.45]
    assert fired(run(KLDetector(KLRule(), REARM), [{"kl": v} for v in [*spiky, *high]])) == []
    quiet = [0.032, 0.036, 0.034, 0.038, 0.036, 0.032, 0.036, 0.034, 0.036, 0.035]
    alerts = run(KLDetector(KLRule(), REARM), [{"kl": v} for v in [*quiet, *high]])
    assert fired(alerts) == [("kl_jump", 12)]
    assert "on 8 df beyond 6.4" in alerts[0].message


def test_kl_silent_on_smooth_growth_from_zero() -> None:
    # TRL's KL is exactly 0 at the first step and grows smoothly with a small beta.
    rows = [{"kl": 0.007 * t} for t in range(30)]
    assert run(KLDetector(KLRule(), REARM), rows) == []


# ---- held-out divergence -----------------------------------------------------------------------


def _heldout_rows(train: list[float], evals: dict[int, float]) -> list[dict[str, float]]:
    rows = []
    for t, r in enumerate(train, start=1):
        row = {"rewards/judge/mean": r, "reward": r}
        if t in evals:
            row["eval/judge/mean"] = evals[t]
        rows.append(row)
    return rows


def test_heldout_divergence_fires_when_eval_falls_as_train_rises() -> None:
    train = [0.2 + 0.02 * t for t in range(1, 31)]
    evals = {5: 0.5, 10: 0.56, 15: 0.53, 20: 0.45, 25: 0.35, 30: 0.3}
    alerts = run(HeldoutDetector(HeldoutRule(), REARM, ["judge"]), _heldout_rows(train, evals))
    assert fired(alerts) == [("heldout_divergence", 20)]
    assert alerts[0].value == pytest.approx(0.11)
    assert "step 10" in alerts[0].message
    assert "no eval/judge/stderr logged" in alerts[0].message


def test_heldout_divergence_on_the_total_reward() -> None:
    rows = [{"reward": 0.2 + 0.02 * t} for t in range(1, 31)]
    for t, v in {10: 0.6, 20: 0.4}.items():
        rows[t - 1]["eval/reward"] = v
    alerts = run(HeldoutDetector(HeldoutRule(), REARM, []), rows)
    assert fired(alerts) == [("heldout_divergence", 20)]
    assert alerts[0].message.startswith("total reward:")


def test_heldout_divergence_of_a_watched_reward_against_the_total() -> None:
    # The run optimises `depth` (total reward rising); `quality` has weight 0: on the training
    # batches it falls as well, so only its held-out eval against the total reward can diverge.
    rows: list[dict[str, float]] = []
    for t in range(1, 31):
        row = {"reward": 1.0 + 0.1 * t, "rewards/depth/mean": 1.0 + 0.1 * t}
        row["rewards/quality/mean"] = 0.9 - 0.02 * t
        if t % 5 == 0:
            row["eval/quality/mean"] = {5: 0.9, 10: 0.92, 15: 0.8, 20: 0.6}.get(t, 0.5)
            row["eval/quality/stderr"] = 0.02
        rows.append(row)
    names = ["depth", "quality"]
    alerts = run(HeldoutDetector(HeldoutRule(watch=["quality"]), REARM, names), rows)
    # z = 0.12 / (0.02 sqrt 2) = 4.2 at step 15 against the bar 3.99 (the best of 2 earlier evals).
    assert fired(alerts) == [("heldout_divergence", 15)]
    assert alerts[0].message.startswith("quality (watched) against the total reward")
    assert "from 0.92 (step 10) to 0.8" in alerts[0].message
    # Unwatched, the same metrics raise nothing: quality fell on the training prompts too.
    assert run(HeldoutDetector(HeldoutRule(), REARM, names), rows) == []


@pytest.mark.parametrize(("stderr", "expect"), [(0.1, []), (0.01, [("heldout_divergence", 20)])])
def test_heldout_drop_tested_against_the_logged_standard_error(
    stderr: float, expect: list[tuple[str, int]]
) -> None:
    # The drop at step 20 is 0.11 from the best eval (0.56 at step 10), the best of 3 earlier
    # evals: z = 0.11 / (stderr * sqrt 2) against the one-sided normal quantile at 1e-4 / 3
    # (3.99): 0.78 with evals of 16 samples (stderr 0.1) is noise, 7.8 is not.
    train = [0.2 + 0.02 * t for t in range(1, 31)]
    rows = _heldout_rows(train, {5: 0.5, 10: 0.56, 15: 0.53, 20: 0.45})
    for row in rows:
        if "eval/judge/mean" in row:
            row["eval/judge/stderr"] = stderr
    alerts = run(HeldoutDetector(HeldoutRule(), REARM, ["judge"]), rows)
    assert fired(alerts) == expect
    if alerts:
        assert "z = 7.8 against the evals' standard errors" in alerts[0].message


@pytest.mark.parametrize("slope", [0.02, -0.01])
def test_heldout_silent_when_eval_follows_train(slope: float) -> None:
    train = [0.5 + slope * t for t in range(1, 31)]
    evals = {t: 0.4 + slope * t for t in range(5, 31, 5)}
    rows = _heldout_rows(train, evals)
    assert run(HeldoutDetector(HeldoutRule(), REARM, ["judge"]), rows) == []


# ---- watched reward against the trained one ----------------------------------------------------


def _divergence_rows(quality_slope: float, reward_slope: float) -> list[dict[str, float]]:
    rng = random.Random(3)
    return [
        {
            "reward": 2.0 + reward_slope * max(0, t - 20) + rng.gauss(0, 0.4),
            "rewards/quality/mean": max(0.0, 0.3 + quality_slope * max(0, t - 20))
            + rng.gauss(0, 0.08),
        }
        for t in range(1, 41)
    ]


def test_divergence_fires_when_the_watched_reward_falls_as_the_trained_one_rises() -> None:
    det = DivergenceDetector(DivergenceRule(), REARM, ["quality"])
    alerts = run(det, _divergence_rows(-0.02, 0.12))
    assert [a.rule for a in alerts] == ["reward_divergence"]
    assert 25 <= alerts[0].step <= 40
    assert "'quality' (watched) fell" in alerts[0].message and "t = +" in alerts[0].message


@pytest.mark.parametrize(
    ("quality_slope", "reward_slope"), [(0.0, 0.12), (0.01, 0.12), (-0.02, 0.0)]
)
def test_divergence_silent_unless_both_move(quality_slope: float, reward_slope: float) -> None:
    # a healthy run (quality flat or up while the reward rises), or quality falling alone
    det = DivergenceDetector(DivergenceRule(), REARM, ["quality"])
    assert run(det, _divergence_rows(quality_slope, reward_slope)) == []


def test_divergence_watches_nothing_by_default() -> None:
    assert run(MonitorSet(MonitorConfig(), ["quality"]), _divergence_rows(-0.02, 0.12)) == []


# ---- entropy collapse --------------------------------------------------------------------------


def test_entropy_collapse_against_early_level() -> None:
    rows = [{"entropy": 1.0 if t <= 5 else 0.1} for t in range(1, 21)]
    alerts = run(EntropyDetector(EntropyRule(), REARM), rows)
    # smoothed: step 6 0.7, step 7 0.4, step 8 0.1 < 0.2 * 1.0
    assert fired(alerts) == [("entropy_collapse", 8)]
    assert alerts[0].value == pytest.approx(0.1)
    assert "10% of its early level" in alerts[0].message
    # It names the setting that counters a collapse, aimed at the run's own early entropy.
    assert "training.use_adaptive_entropy: true with entropy_target: 1 " in alerts[0].message
    assert "entropy_coef" in alerts[0].message


def test_entropy_floor_fires_from_the_start() -> None:
    alerts = run(EntropyDetector(EntropyRule(), REARM), [{"entropy": 0.02}] * 5)
    assert fired(alerts) == [("entropy_collapse", 1)]


def test_entropy_silent_on_moderate_decline() -> None:
    rows = [{"entropy": 1.0 - 0.5 * t / 40} for t in range(40)]
    assert run(EntropyDetector(EntropyRule(), REARM), rows) == []


def _solved_rows(entropy: float, solved: float, zero_std: float = 1.0) -> list[dict[str, float]]:
    return [
        {
            "entropy": entropy,
            "completions/max_group_duplicate_frac": 1.0,
            "frac_reward_zero_std": zero_std,
            "frac_reward_solved": solved,
        }
    ] * 10


@pytest.mark.parametrize("detector", [EntropyDetector, GroupDominanceDetector])
def test_identical_right_answers_are_not_a_stall(detector: type) -> None:
    rule = EntropyRule() if detector is EntropyDetector else GroupDominanceRule()
    # every group solved, or half solved and the other half still differing: no alert
    assert run(detector(rule, REARM), _solved_rows(0.01, solved=1.0)) == []
    assert run(detector(rule, REARM), _solved_rows(0.01, solved=0.5, zero_std=0.5)) == []
    # the same texts on unsolved groups are a stall: the alert names the share
    alerts = run(detector(rule, REARM), _solved_rows(0.01, solved=0.25))
    assert [a.rule for a in alerts] == [detector.rule]
    assert "75% of groups give no signal unsolved" in alerts[0].message
    # min_stalled_frac 0 restores the level rule alone
    relaxed = rule.model_copy(update={"min_stalled_frac": 0.0})
    assert len(run(detector(relaxed, REARM), _solved_rows(0.01, solved=1.0))) == 1


# ---- reward saturation ---------------------------------------------------------------------------


def _saturation_rows(judge_slope: float, format_top: float) -> list[dict[str, float]]:
    rows = []
    for t in range(1, 31):
        share = min(format_top, 0.5 + 0.1 * (t - 1))
        rows.append(
            {
                "pass_rate/format": share,
                "rewards/format/mean": share,
                "rewards/judge/mean": 0.6 + judge_slope * t,
            }
        )
    return rows


def test_saturation_fires_when_one_reward_maxes_and_another_falls() -> None:
    det = SaturationDetector(SaturationRule(), REARM, ["format", "judge"], {})
    alerts = run(det, _saturation_rows(-0.02, 1.0))
    # the first full 24-step window of the falling judge reward: steps 13-24 against 1-12
    assert fired(alerts) == [("reward_saturation", 24)]
    assert alerts[0].value == pytest.approx(1.0)
    assert "'format' is saturated" in alerts[0].message and "'judge'" in alerts[0].message


def test_saturation_from_known_maximum_without_pass_rate() -> None:
    rows = [
        {k: v for k, v in r.items() if not k.startswith("pass_rate")}
        for r in _saturation_rows(-0.02, 1.0)
    ]
    det = SaturationDetector(SaturationRule(), REARM, ["format", "judge"], {"format": 1.0})
    assert fired(run(det, rows)) == [("reward_saturation", 24)]
    # without the maximum there is no way to tell saturation: no alert
    det = SaturationDetector(SaturationRule(), REARM, ["format", "judge"], {})
    assert run(det, rows) == []


@pytest.mark.parametrize(("slope", "top"), [(0.0, 1.0), (-0.02, 0.7)])
def test_saturation_silent(slope: float, top: float) -> None:
    det = SaturationDetector(SaturationRule(), REARM, ["format", "judge"], {})
    assert run(det, _saturation_rows(slope, top)) == []


# ---- group dominance -----------------------------------------------------------------------------


def test_group_dominance_fires() -> None:
    rows = [{"completions/max_group_duplicate_frac": 0.25 if t <= 5 else 1.0} for t in range(1, 16)]
    alerts = run(GroupDominanceDetector(GroupDominanceRule(), REARM), rows)
    assert fired(alerts) == [("group_dominance", 8)]
    assert alerts[0].value == pytest.approx(1.0)


def test_group_dominance_silent_on_partial_duplicates() -> None:
    rows = [{"completions/max_group_duplicate_frac": 0.5}] * 20
    assert run(GroupDominanceDetector(GroupDominanceRule(), REARM), rows) == []


# ---- the set -------------------------------------------------------------------------------------


def _healthy_run(steps: int = 60) -> list[dict[str, object]]:
    rng = random.Random(1)
    rows: list[dict[str, object]] = []
    for t in range(steps):
        reward = 0.3 + 0.3 * t / steps + rng.gauss(0, 0.03)
        rows.append(
            {
                "reward": reward,
                "rewards/format/mean": min(1.0, 0.5 + t / steps * 0.3 + rng.gauss(0, 0.02)),
                "rewards/judge/mean": 0.2 + 0.2 * t / steps + rng.gauss(0, 0.02),
                "pass_rate/format": 0.4 + 0.3 * t / steps,
                "completions/mean_length": 80 + rng.gauss(0, 4),
                "kl": 0.002 * t + abs(rng.gauss(0, 0.002)),
                "entropy": 0.9 - 0.2 * t / steps + rng.gauss(0, 0.03),
                "completions/repeated_ngram_frac": 0.04 + abs(rng.gauss(0, 0.01)),
                "completions/distinct_2": 0.7 + rng.gauss(0, 0.02),
                "completions/max_group_duplicate_frac": 0.25,
                **({"eval/format/mean": 0.5 + 0.3 * t / steps} if t % 10 == 0 else {}),
            }
        )
    return rows


def test_monitor_set_silent_on_a_healthy_run() -> None:
    assert run(MonitorSet(MonitorConfig(), ["format", "judge"]), _healthy_run()) == []


def test_monitor_set_combines_and_switches_rules() -> None:
    rows = [
        {"kl": 0.9, "entropy": 0.01, "completions/max_group_duplicate_frac": 1.0, "step_time": 3.0}
        for _ in range(5)
    ]
    alerts = run(MonitorSet(MonitorConfig(), ["r"]), rows)
    assert sorted(fired(alerts)) == [
        ("entropy_collapse", 1),
        ("group_dominance", 3),
        ("kl_high", 1),
    ]
    cfg = MonitorConfig.model_validate({"kl": {"enabled": False}, "entropy": {"floor": 0.001}})
    assert fired(run(MonitorSet(cfg, ["r"]), rows)) == [("group_dominance", 3)]
    off = MonitorConfig(enabled=False)
    assert run(MonitorSet(off, ["r"]), rows) == []


def test_monitor_set_ignores_missing_and_non_numeric_values() -> None:
    rows: list[dict[str, object]] = [
        {"kl": None, "entropy": math.nan, "reward": "n/a", "alerts": [], "epoch": True}
    ] * 20
    assert run(MonitorSet(MonitorConfig(), ["r"]), rows) == []


def test_alert_serialises_for_metrics_jsonl() -> None:
    alert = Alert("kl_high", 7, 0.9, "KL is 0.9")
    assert json.loads(json.dumps(alert.to_dict())) == {
        "rule": "kl_high",
        "step": 7,
        "value": 0.9,
        "message": "KL is 0.9",
    }
    assert str(alert) == "[monitor kl_high @ step 7] KL is 0.9"


def test_config_rejects_unknown_keys_and_bad_windows() -> None:
    with pytest.raises(ValueError, match="extra"):
        MonitorConfig.model_validate({"kl": {"max": 1.0}})
    with pytest.raises(ValueError, match="jump_min_history"):
        MonitorConfig.model_validate({"kl": {"jump_window": 3, "jump_min_history": 5}})
