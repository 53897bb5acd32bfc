from __future__ import annotations

import math

import pytest

from grpokit.rewards.judge.expected import TokenLogprob, expected_score
from grpokit.rewards.judge.parse import find_score, normalise, parse_score


@pytest.mark.parametrize(
    ("reply", "low", "high", "expected"),
    [
        ("0.6", 0, 1, 0.6),
        ("0.6点", 0, 1, 0.6),
        ("Score: 3/5", 0, 1, 0.6),
        ("3/5", 0, 1, 0.6),
        ("8 out of 10", 0, 1, 0.8),
        ("**Score**: 0.8", 0, 1, 0.8),
        ("０．６", 0, 1, 0.6),
        ("スコア：０．８点", 0, 1, 0.8),
        ("評価は0.4です。", 0, 1, 0.4),
        ("0.0から1.0のうち0.6点", 0, 1, 0.6),
        ("60%", 0, 1, 0.6),
        (" 1.0\n", 0, 1, 1.0),
        ("0", 0, 1, 0.0),
        # On a 1-5 scale "3/5" is 3: normalised (3 - 1) / 4.
        ("Score: 3/5", 1, 5, 0.5),
        ("8/10", 0, 10, 0.8),
        ("I give it 3/5", 0, 10, 0.6),
        ("Rating (1-5): 4", 1, 5, 0.75),
        ("Score from 0 to 10: 7", 0, 10, 0.7),
        ("The idea scores 8 out of 10.", 0, 10, 0.8),
        ("Proposal: 0.5\nYour score is 1.0", 0, 1, 1.0),
        ("1. Revenue model: yes\n2. Customer: vague\nTotal: 0.4", 0, 1, 0.4),
        ("0.2\n\nThe proposal has 5 parts.", 0, 1, 0.2),
        ("The proposal meets 3 of the 5 criteria. 0.6", 0, 1, 0.6),
        ("x3 model, score 0.5", 0, 1, 0.5),
    ],
)
def test_parses_scores(reply: str, low: float, high: float, expected: float) -> None:
    assert parse_score(reply, low, high) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("reply", "low", "high"),
    [
        ("none", 0, 1),
        ("", 0, 1),
        ("I cannot evaluate this proposal.", 0, 1),
        ("Rating (1-5): ", 1, 5),  # the scale echoed back is not a score
        ("7", 0, 1),  # out of range: a broken rubric, not a score to clip
        ("1.5", 0, 1),
        ("Score: 12/10", 0, 10),
        ("-0.5", 0, 1),
        ("10 USD per month", 0, 1),
    ],
)
def test_unusable_replies_give_none(reply: str, low: float, high: float) -> None:
    assert parse_score(reply, low, high) is None


def test_position_maps_back_to_original_text() -> None:
    reply = "スコア：０．８点"
    found = find_score(reply, 0, 1)
    assert found is not None
    assert reply[found.start : found.end] == "０．８"
    fraction = find_score("Score: 3/5", 0, 1)
    assert fraction is not None
    assert (fraction.kind, fraction.denominator, fraction.number) == ("fraction", 5.0, 3.0)


def test_negative_scale() -> None:
    assert parse_score("-0.5", -1, 1) == pytest.approx(0.25)


def test_normalise() -> None:
    assert normalise(3, 1, 5) == 0.5
    assert normalise(0.2, 0, 1) == pytest.approx(0.2)
    assert normalise(11, 0, 10) == 1.0
    assert normalise(-1, 0, 10) == 0.0
    with pytest.raises(ValueError, match="low < high"):
        normalise(0.5, 1, 1)
    with pytest.raises(ValueError, match="low < high"):
        parse_score("0.5", 1, 0)


def _tokens(
    text: str, pieces: list[str], tops: dict[int, list[tuple[str, float]]]
) -> list[TokenLogprob]:
    assert "".join(pieces) == text
    out = []
    offset = 0
    for i, piece in enumerate(pieces):
        top = tuple((tok, math.log(p)) for tok, p in tops.get(i, [(piece, 1.0)]))
        chosen = dict(top).get(piece, 0.0)
        out.append(TokenLogprob(offset=offset, token=piece, logprob=chosen, top=top))
        offset += len(piece)
    return out


def test_expected_weights_the_last_digit() -> None:
    # "0.6" with P(6)=0.5, P(8)=0.3, P(4)=0.2 at the tenths: 0.3 + 0.24 + 0.08.
    tokens = _tokens("0.6", ["0", ".", "6"], {2: [("6", 0.5), ("8", 0.3), ("4", 0.2)]})
    assert expected_score("0.6", tokens, 0, 1) == pytest.approx(0.62)


def test_expected_is_geval_on_an_integer_scale() -> None:
    # "Rating: 3" on 1-5; "x" and "12" spell no in-range score and are left out (renormalised).
    reply = "Rating: 3"
    tops = {2: [("3", 0.4), ("4", 0.3), ("2", 0.1), ("x", 0.1), ("12", 0.1)]}
    tokens = _tokens(reply, ["Rating", ":", " 3"], {2: [(" " + t, p) for t, p in tops[2]]})
    want = (0.4 * 0.5 + 0.3 * 0.75 + 0.1 * 0.25) / 0.8
    assert expected_score(reply, tokens, 1, 5) == pytest.approx(want)


def test_expected_keeps_fraction_form() -> None:
    tokens = _tokens("3/5", ["3", "/", "5"], {0: [("3", 0.5), ("4", 0.5)]})
    assert expected_score("3/5", tokens, 0, 1) == pytest.approx(0.7)


def test_expected_without_score_or_tokens() -> None:
    assert expected_score("no idea", _tokens("no idea", ["no", " idea"], {}), 0, 1) is None
    # No token covers the number (positions missing): the written score stands.
    assert expected_score("0.4", [], 0, 1) == pytest.approx(0.4)


def test_expected_drops_unfinished_numbers() -> None:
    # After "0." a newline would leave "0." unfinished; it must not count as a score of 0.
    tokens = _tokens("0.6", ["0", ".", "6"], {2: [("6", 0.5), ("\n", 0.5)]})
    assert expected_score("0.6", tokens, 0, 1) == pytest.approx(0.6)
