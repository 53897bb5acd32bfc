"""Advantages: hand-computed values, invariants and argument errors."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.core.advantages import (
    ADVANTAGE_ESTIMATORS,
    MULTI_OBJECTIVE_AGGREGATIONS,
    REWARD_SCALES,
    compute_advantages,
    group_advantages,
    normalize_then_sum,
    reward_zero_std_mask,
    rewards_zero_std_mask,
)

NAN = float("nan")


def t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_group_scale_hand_computed() -> None:
    # Group [1, 0, 0, 0]: mean 0.25, deviations (0.75, -0.25, -0.25, -0.25), squares sum 0.75,
    # Bessel variance 0.75 / 3 = 0.25, std 0.5. With eps 1e-4: 0.75 / 0.5001, -0.25 / 0.5001.
    # Group [2, 4]: mean 3, deviations (-1, 1), variance 2 / 1 = 2, std sqrt(2) = 1.41421356.
    adv = group_advantages(t([1, 0, 0, 0, 2, 4, 3, 3]), 2)
    assert adv.shape == (8,)
    adv4 = group_advantages(t([1, 0, 0, 0]), 4)
    torch.testing.assert_close(
        adv4, t([1.4997000599880024, -0.4999000199960008, -0.4999000199960008, -0.4999000199960008])
    )
    # Pairs: [1, 0] mean 0.5 std sqrt(0.5) = 0.70710678 -> +-0.5 / 0.70720678 = +-0.70700678...
    torch.testing.assert_close(
        adv[:2], t([0.5 / (math.sqrt(0.5) + 1e-4), -0.5 / (math.sqrt(0.5) + 1e-4)])
    )
    torch.testing.assert_close(
        adv[4:6], t([-1 / (1.41421356237 + 1e-4), 1 / (1.41421356237 + 1e-4)])
    )
    torch.testing.assert_close(adv[6:], t([0.0, 0.0]))


def test_bessel_corrected_not_population_std() -> None:
    # [0, 2]: population std 1, Bessel std sqrt(2); with eps 0 the advantages are -+1/sqrt(2).
    adv = group_advantages(t([0, 2]), 2, eps=0.0)
    torch.testing.assert_close(adv, t([-1 / math.sqrt(2), 1 / math.sqrt(2)]))


def test_batch_scale_hand_computed() -> None:
    # Groups [1,0,0,0] and [1,1,1,0]. Batch of 8 rewards: mean 0.5, every squared deviation 0.25,
    # sum 2, Bessel variance 2 / 7 = 0.2857142857, std 0.5345224838.
    # Group means 0.25 and 0.75 -> centred (0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75).
    std = 0.5345224838248488
    adv = group_advantages(t([1, 0, 0, 0, 1, 1, 1, 0]), 4, scale="batch")
    centred = t([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75])
    torch.testing.assert_close(adv, centred / (std + 1e-4))


def test_none_scale_is_centred_rewards() -> None:
    adv = group_advantages(t([3, 1, 5, 7]), 2, scale="none")
    torch.testing.assert_close(adv, t([1, -1, -1, 1]))


def test_nan_rows_hand_computed() -> None:
    # [1, NaN, 0, 0]: valid (1, 0, 0), mean 1/3, squares 4/9 + 1/9 + 1/9 = 6/9, Bessel var 1/3,
    # std 0.5773502692. Advantages 0.6666667 / 0.5774503, 0, -0.3333333 / 0.5774503 (x2).
    d = 0.5773502691896258 + 1e-4
    adv = group_advantages(t([1, NAN, 0, 0]), 4)
    torch.testing.assert_close(adv, t([(2 / 3) / d, 0.0, (-1 / 3) / d, (-1 / 3) / d]))


def test_nan_rows_do_not_change_the_others() -> None:
    with_nan = group_advantages(t([0.3, NAN, 1.0, 0.2, NAN, 0.7]), 6)
    without = group_advantages(t([0.3, 1.0, 0.2, 0.7]), 4)
    torch.testing.assert_close(with_nan[[0, 2, 3, 5]], without)
    assert with_nan[1] == 0 and with_nan[4] == 0
    # Batch scale: the NaN row is out of the batch std as well. Valid rewards
    # (0.3, 1.0 | 0.2, 0.5, 0.9): group means 0.65 and 0.5333..., batch std of the five values.
    adv = group_advantages(t([0.3, NAN, 1.0, 0.2, 0.5, 0.9]), 3, scale="batch")
    std = float(t([0.3, 1.0, 0.2, 0.5, 0.9]).std()) + 1e-4
    expected = t([0.3 - 0.65, 0.0, 1.0 - 0.65, 0.2 - 1.6 / 3, 0.5 - 1.6 / 3, 0.9 - 1.6 / 3]) / std
    expected[1] = 0.0
    torch.testing.assert_close(adv, expected)


def test_all_nan_group_and_single_valid_give_zero() -> None:
    adv = group_advantages(t([NAN, NAN, 5.0, NAN]), 2)
    torch.testing.assert_close(adv, t([0, 0, 0, 0]))
    adv_rloo = compute_advantages(t([NAN, NAN, 5.0, NAN]), 2, estimator="rloo")
    torch.testing.assert_close(adv_rloo, t([0, 0, 0, 0]))


@pytest.mark.parametrize("estimator", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("scale", sorted(REWARD_SCALES))
def test_equal_rewards_give_zero_advantage(estimator: str, scale: str) -> None:
    rewards = t([0.5, 0.5, 0.5, 2.0, 2.0, 2.0, 1.0, NAN, 1.0])
    for eps in (1e-4, 0.0):
        adv = compute_advantages(rewards, 3, estimator=estimator, scale=scale, eps=eps)
        torch.testing.assert_close(adv, torch.zeros(9, dtype=torch.float64))


def test_rloo_hand_computed() -> None:
    # [1, 0, 0, 0]: the first's baseline is mean(0, 0, 0) = 0 -> 1; the others' baseline is
    # mean(1, 0, 0) = 1/3 -> -1/3.
    adv = compute_advantages(t([1, 0, 0, 0]), 4, estimator="rloo", scale="none")
    torch.testing.assert_close(adv, t([1, -1 / 3, -1 / 3, -1 / 3]))
    # With a NaN the baseline uses the other *valid* rewards: [2, NaN, 0, 1] -> 2 - 0.5,
    # 0 - 1.5, 1 - 1.
    adv = compute_advantages(t([2, NAN, 0, 1]), 4, estimator="rloo", scale="none")
    torch.testing.assert_close(adv, t([1.5, 0.0, -1.5, 0.0]))


def test_rloo_is_rescaled_grpo() -> None:
    # r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean_j r_j).
    rewards = torch.rand(12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grpo = compute_advantages(rewards, 4, estimator="grpo", scale="none")
    rloo = compute_advantages(rewards, 4, estimator="rloo", scale="none")
    torch.testing.assert_close(rloo, grpo * 4 / 3)


def test_float32_keeps_dtype() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0]), 2)
    assert adv.dtype == torch.float32


def test_zero_std_mask() -> None:
    rewards = t([1, 1, 1, 1, 0, 1, NAN, 0, NAN, NAN, NAN, NAN, 0.5, 0.5 + 1e-12, NAN, 0.5])
    mask = reward_zero_std_mask(rewards, 4)
    # group 0: all 1 -> flat; group 1: (0, 1, 0) after NaN -> signal; group 2: all NaN -> flat;
    # group 3: equal within 1e-8 -> flat.
    assert mask.tolist() == [True, False, True, True]
    assert reward_zero_std_mask(t([0.5, 0.5 + 1e-12, 0.4, 0.41]), 2).tolist() == [True, False]
    assert reward_zero_std_mask(t([0.5, 0.5 + 1e-12]), 2, atol=0.0).tolist() == [False]
    assert reward_zero_std_mask(t([3.0, NAN]), 2).tolist() == [True]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"group_size": 3}, "group_size=3 does not divide"),
        ({"group_size": 0}, "group_size must be an integer >= 1"),
        ({"group_size": 2, "scale": "std"}, "unknown scale 'std'"),
        ({"group_size": 2, "estimator": "ppo"}, "unknown estimator 'ppo'"),
        ({"group_size": 2, "eps": -1.0}, "eps must be >= 0"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compute_advantages(t([1, 0, 1, 0]), **kwargs)  # type: ignore[arg-type]


def test_bad_rewards() -> None:
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match="floating"):
        group_advantages(torch.tensor([1, 0]), 2)
    with pytest.raises(ValueError, match="inf"):
        group_advantages(t([1, math.inf]), 2)
    with pytest.raises(ValueError, match="does not divide"):
        reward_zero_std_mask(t([1, 0, 1]), 2)


# ---- several rewards: normalize_then_sum (GDPO) -------------------------------------------------


def cols(*columns: list[float]) -> torch.Tensor:
    """(B, F) from F columns of B rewards."""
    return torch.tensor(columns, dtype=torch.float64).T


def test_normalize_then_sum_hand_computed_with_a_gated_none() -> None:
    # One group of 4: format (1, 1, 0, 0); a judge behind the format gate scored only the two
    # that passed (0.3, 0.9), None for the others. Weights 1, 1; eps 1e-4.
    # format: mean 0.5, Bessel std sqrt(1/3) = 0.5773503 -> +-0.5 / 0.5774503 = +-0.8658754.
    # judge: the Nones are out of its mean and std: (0.3, 0.9), mean 0.6, std sqrt(0.18) =
    #   0.4242641 -> -+0.3 / 0.4243641 = -+0.7069402; the Nones add 0.
    # S = (0.1589353, 1.5728156, -0.8658754, -0.8658754): mean 0, Bessel std 1.1544825.
    # A = S / 1.1545825.
    adv = normalize_then_sum(cols([1, 1, 0, 0], [0.3, 0.9, NAN, NAN]), t([1.0, 1.0]), 4)
    torch.testing.assert_close(
        adv, t([0.1376560536285467, 1.3622374579918994, -0.7499467558102231, -0.7499467558102231])
    )
    # The same judge with the gate's otherwise 0 (a number) enters its statistics as 0: the two
    # that failed the format are then pushed down by the judge as well.
    zero = normalize_then_sum(cols([1, 1, 0, 0], [0.3, 0.9, 0.0, 0.0]), t([1.0, 1.0]), 4)
    assert zero[2] == zero[3] < adv[2]


def test_a_dense_score_does_not_drown_a_binary_one() -> None:
    # format (1, 0, 1, 0) and a judge on 0..10 (9, 8, 2, 1). Summed first, the total
    # (10, 8, 3, 1) ranks the unformatted 8 above the formatted 2. Normalised one by one:
    # format +-0.8658754; judge (4, 3, -3, -4) / (sqrt(50/3) + 1e-4) = (0.9797719, 0.7348289,
    # -0.7348289, -0.9797719); S = (1.8456473, -0.1310465, 0.1310465, -1.8456473).
    rewards = cols([1, 0, 1, 0], [9, 8, 2, 1])
    weights = t([1.0, 1.0])
    summed_first = compute_advantages((rewards * weights).sum(dim=1), 4)
    assert summed_first[1] > summed_first[2]
    adv = normalize_then_sum(rewards, weights, 4)
    s = t([1.8456473, -0.1310465, 0.1310465, -1.8456473])
    std = math.sqrt(float((s**2).sum()) / 3)
    torch.testing.assert_close(adv, s / (std + 1e-4), atol=1e-6, rtol=1e-6)
    assert adv[2] > adv[1]


def test_normalize_then_sum_batch_std_over_groups_and_scored_rows() -> None:
    # Group 1: one reward (0, 2 | 1, 1): A = (-1, 1) / (sqrt(2) + eps) and (0, 0). Group 2: the
    # second row has no reward at all: out of the batch std, advantage 0.
    e = 1e-4
    a = 1 / (math.sqrt(2) + e)
    adv = normalize_then_sum(
        cols([0, 2, 1, 1, 5, NAN], [NAN, NAN, NAN, NAN, NAN, NAN]), t([1.0, 3.0]), 2
    )
    # Scored rows' S: (-a, a, 0, 0, 0): mean 0, Bessel std sqrt(2 a^2 / 4).
    std = math.sqrt(2 * a * a / 4)
    torch.testing.assert_close(adv, t([-a, a, 0, 0, 0, 0]) / (std + e))


def test_one_reward_normalize_then_sum_is_the_whitened_advantage() -> None:
    rewards = torch.rand(12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grpo = compute_advantages(rewards, 4)
    adv = normalize_then_sum(rewards[:, None], t([2.5]), 4)
    torch.testing.assert_close(adv, 2.5 * grpo / (2.5 * grpo.std() + 1e-4))


@pytest.mark.parametrize("estimator", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("scale", sorted(REWARD_SCALES))
def test_normalize_then_sum_flat_rewards_give_exact_zero(estimator: str, scale: str) -> None:
    # Group 1 flat in both rewards, group 2 not: group 1 stays exactly 0.
    rewards = cols([1, 1, 1, 0, 1, 1], [0.2, 0.2, NAN, 0.1, 0.7, 0.4])
    adv = normalize_then_sum(rewards, t([1.0, 0.5]), 3, estimator=estimator, scale=scale)
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert bool((adv[3:] != 0).any())
    flat = normalize_then_sum(cols([1, 1, 0, 0], [3, 3, 1, 1]), t([1.0, 1.0]), 2)
    assert flat.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_rewards_zero_std_mask_needs_every_reward_flat() -> None:
    # Group 1: both flat. Group 2: the sum is flat (1, 1) but the rewards are not: a signal.
    # Group 3: the second reward all None: flat there, the first decides.
    rewards = cols([1, 1, 1, 0, 0.5, 0.2], [2, 2, 0, 1, NAN, NAN])
    assert rewards_zero_std_mask(rewards, 2).tolist() == [True, False, False]
    assert reward_zero_std_mask((rewards.nan_to_num(0)).sum(dim=1), 2).tolist() == [
        True,
        True,
        False,
    ]


def test_aggregation_registry() -> None:
    assert sorted(MULTI_OBJECTIVE_AGGREGATIONS) == ["normalize_then_sum", "sum_then_normalize"]
    per_function = cols([1, 0, 1, 1], [0.5, 0.2, NAN, 0.1])
    weights = t([1.0, 2.0])
    total = t([2.0, 0.4, 1.0, 1.2])
    by_sum = MULTI_OBJECTIVE_AGGREGATIONS["sum_then_normalize"]
    torch.testing.assert_close(
        by_sum.advantages(total, per_function, weights, 2, estimator="rloo", scale="batch"),
        compute_advantages(total, 2, estimator="rloo", scale="batch"),
    )
    assert by_sum.no_signal(total, per_function, 2).tolist() == [False, False]
    gdpo = MULTI_OBJECTIVE_AGGREGATIONS["normalize_then_sum"]
    torch.testing.assert_close(
        gdpo.advantages(total, per_function, weights, 2),
        normalize_then_sum(per_function, weights, 2),
    )


def test_normalize_then_sum_bad_shapes() -> None:
    with pytest.raises(ValueError, match=r"\(B, F\)"):
        normalize_then_sum(t([1, 0]), t([1.0]), 2)
    with pytest.raises(ValueError, match="one per reward"):
        normalize_then_sum(cols([1, 0], [0, 1]), t([1.0]), 2)
