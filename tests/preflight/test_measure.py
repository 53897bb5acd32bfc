"""Preflight measurements on hand-made reward tables and rollouts."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.data.prompts import PromptRow
from grpokit.preflight.measure import (
    DrawRecord,
    RewardInfo,
    completion_stats,
    measure,
    merge_scores,
    part_table,
    partial_credit,
    reward_table,
)
from grpokit.rewards.compose import RewardScores
from grpokit.rollout.base import RolloutBatch
from grpokit.sampling import ScoredBatch

NAN = math.nan


def _scores(format_col: list[float], answer_col: list[float], gated: list[bool]) -> RewardScores:
    per = torch.tensor([format_col, answer_col], dtype=torch.float32).T
    gated_out = torch.zeros_like(per, dtype=torch.bool)
    gated_out[:, 1] = torch.tensor(gated)
    present = ~torch.isnan(per)
    total = torch.where(present, per, torch.zeros_like(per)).sum(1)
    total = torch.where(present.any(1), total, torch.full_like(total, NAN))
    return RewardScores(["format", "answer"], per, gated_out, total, {})


# 3 groups of 4. format: group 0 all 0, group 1 one pass, group 2 two passes (3/12 at max).
FORMAT = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.7, 0.0, 1.0, 1.0, 0.0, 0.7]
# answer is gated on format: computed only where format == 1 (rows 4, 8, 9); row 9 unparsable.
ANSWER = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, NAN, 0.0, 0.0]
GATED = [True] * 4 + [False, True, True, True] + [False, False, True, True]


def test_reward_table_hand_made() -> None:
    scores = _scores(FORMAT, ANSWER, GATED)
    fmt, ans = reward_table(scores, [1.0, 1.0], 4, beta=1.0, std_normalized=True)
    assert (fmt.passed, fmt.applicable, fmt.samples) == (3, 12, 12)
    assert fmt.pass_rate == 0.25
    # Wilson 3/12, z = 1.959964: z^2/n = 0.3201216, centre = (0.25 + 0.1600608) / 1.3201216
    # = 0.310620, half = 1.959964 / 1.3201216 * sqrt(0.25 * 0.75 / 12 + 0.3201216 / 48)
    # = 1.484681 * 0.1493124 = 0.221681 -> (0.088939, 0.532301).
    assert fmt.interval == pytest.approx((0.088942, 0.532305), abs=1e-5)
    assert fmt.mean == pytest.approx(4.4 / 12)
    # Only group 0 (all 0.0) is flat for format.
    assert fmt.zero_variance_share == pytest.approx(1 / 3)
    assert fmt.none_share == 0.0 and fmt.gated_out_share == 0.0
    # answer: 11 applicable (gated-out rows hold otherwise = 0.0), row 9 returned None.
    assert (ans.passed, ans.applicable) == (1, 11)
    assert ans.none_share == pytest.approx(1 / 12)
    assert ans.gated_out_share == pytest.approx(9 / 12)
    # answer flat in group 0 (all 0) and group 2 (0, None, 0, 0); group 1 has a 1.
    assert ans.zero_variance_share == pytest.approx(2 / 3)
    # Forecast at p_ref 0.25, beta 1 is the fixed point of h, above p_ref.
    assert fmt.forecast is not None and fmt.forecast.p_star is not None
    assert fmt.forecast.p_star > 0.25
    assert fmt.forecast.p_star_low is not None and fmt.forecast.p_star_high is not None
    assert fmt.forecast.p_star_low <= fmt.forecast.p_star <= fmt.forecast.p_star_high


def test_parts_count_only_the_samples_their_reward_scored() -> None:
    """A checklist's items (parts of the gated ``answer`` reward) over the rows where the gate
    let it run: rows 4, 8 and 9; the gated-out rows hold the gate's 0.0 and are left out."""
    scores = _scores(FORMAT, ANSWER, GATED)
    item = [NAN] * 12
    item[4], item[8], item[9] = 1.0, 0.0, 0.75  # a program item's 1/0, a judge's P(yes)
    for row, closed in enumerate(GATED):
        if closed:
            item[row] = 0.0
    unjudged = [0.0 if closed else NAN for closed in GATED]  # the judge gave no answer
    scores.parts = {
        "checklist/price": torch.tensor(item),
        "checklist/customer": torch.tensor(unjudged),
    }
    scores.part_of = {"checklist/price": "answer", "checklist/customer": "answer"}
    price, customer = part_table(scores)
    assert (price.name, price.reward, price.scored, price.passed) == (
        "checklist/price",
        "answer",
        3,
        2,
    )
    assert price.mean == pytest.approx(1.75 / 3)
    # Wilson 2/3, z^2 = 3.841459: centre (2/3 + 0.640243) / 2.280486 = 0.573083, half =
    # 1.959964 / 2.280486 * sqrt(2/27 + 3.841459/36) = 0.859450 * 0.425184 = 0.365424.
    assert price.interval == pytest.approx((0.207659, 0.938507), abs=1e-5)
    assert customer.scored == 0 and customer.passed == 0 and math.isnan(customer.mean)
    assert customer.interval == (0.0, 1.0)


def test_reward_without_maximum_has_no_pass_rate() -> None:
    scores = _scores(FORMAT, ANSWER, GATED)
    fmt, ans = reward_table(scores, [1.0, None], 4, beta=0.04, std_normalized=False)
    assert ans.passed is None and ans.pass_rate is None
    assert ans.interval is None and ans.forecast is None


def test_merge_scores_concatenates_rows() -> None:
    a = _scores(FORMAT[:4], ANSWER[:4], GATED[:4])
    b = _scores(FORMAT[4:], ANSWER[4:], GATED[4:])
    merged = merge_scores([a, b])
    whole = _scores(FORMAT, ANSWER, GATED)
    assert torch.equal(merged.gated_out, whole.gated_out)
    assert torch.allclose(merged.per_function, whole.per_function, equal_nan=True)
    assert torch.allclose(merged.total, whole.total, equal_nan=True)


def _scored(texts: list[str], lengths: list[int], reasons: list[str], g: int) -> ScoredBatch:
    n = len(texts)
    rows = [PromptRow(f"q{i}") for i in range(n // g)]
    # Each completion token has log-prob -0.5, except completion 0 whose tokens have -2.0.
    logprobs = [torch.full((k,), -2.0 if i == 0 else -0.5) for i, k in enumerate(lengths)]
    rollout = RolloutBatch(
        prompt_ids=[[1, 2]] * (n // g),
        completion_ids=[[7] * k for k in lengths],
        logprobs=logprobs,
        finish_reason=reasons,  # type: ignore[arg-type]
        group_size=g,
    )
    values = [1.0 if t.startswith("<a>") else 0.0 for t in texts]
    scores = _scores(values, [NAN] * n, [False] * n)
    return ScoredBatch(rows, [[1, 2]] * (n // g), rollout, texts, scores)


def test_completion_stats() -> None:
    texts = ["x", "x ", "y", "z", "<a>1</a>", "<a>1</a>", "<a>1</a>", "<a>1</a>"]
    lengths = [4, 4, 10, 10, 2, 2, 2, 2]
    reasons = ["eos", "eos", "length", "length", "eos", "eos", "eos", "eos"]
    c = completion_stats([_scored(texts, lengths, reasons, 4)])
    assert c.mean_length == 36 / 8 and (c.min_length, c.max_length) == (2, 10)
    assert c.truncated_share == 0.25
    assert c.mean_terminated_length == 16 / 6
    # -mean log p over tokens: (4 * 2.0 + 32 * 0.5) / 36.
    assert c.entropy == pytest.approx((8.0 + 16.0) / 36)
    # group 0: "x", "x" (stripped), "y", "z" -> 3/4 distinct; group 1: 1/4.
    assert c.distinct_share == pytest.approx((0.75 + 0.25) / 2)


def test_partial_credit_scores_the_same_texts() -> None:
    infos = [RewardInfo("format", "xml_format", tags=("thinking", "answer"))]
    texts = [
        "<thinking>a</thinking>",  # 0.5
        "nothing",  # 0
        "<answer>3</answer> <thinking>b</thinking>",  # 1.0
        "nothing",  # 0
    ]
    [pc] = partial_credit(texts, infos, 2)
    assert pc.reward == "format" and pc.type == "tags_present"
    assert pc.mean == pytest.approx(1.5 / 4)
    assert pc.zero_variance_share == 0.0
    # Already configured with the same tags: nothing to suggest.
    infos.append(RewardInfo("soft", "tags_present", tags=("thinking", "answer")))
    assert partial_credit(texts, infos, 2) == []


def test_measure_end_to_end_on_records() -> None:
    texts = ["<a>1</a>", "b", "c", "d", "e", "f", "g", "h"]
    batch = _scored(texts, [3] * 8, ["eos"] * 8, 4)
    settings = DrawRecord(2, 4, 1.0, 1.0, 0, 16, 0.04, "group", None, 0)
    infos = [RewardInfo("format", "xml_format", tags=("a",)), RewardInfo("answer", "math_answer")]
    m = measure([batch], infos, settings)
    assert m.reward("format").passed == 1
    # Totals: group 0 (1, 0, 0, 0) has signal, group 1 is all 0.
    assert m.total_zero_variance_share == 0.5
    assert m.total_mean == pytest.approx(1 / 8)
    assert len(m.examples) == 4
    with pytest.raises(ValueError, match="group size"):
        measure([batch], infos, DrawRecord(2, 2, 1.0, 1.0, 0, 16, 0.04, "group", None, 0))
