"""xml_format against the seed article's own function, case by case, plus its one improvement."""

from __future__ import annotations

import random

import pytest

from grpokit.rewards import xml_format, xml_format_score
from grpokit.rewards.builtin.format import (
    XmlFormatParams,
    escape_stray_markup,
    strip_code_fences,
    tags_present,
    tags_present_score,
)
from tests.rewards.seed_reference import seed_xml_format_reward

T, P = "<thinking>", "<proposal>"
GOOD = "<thinking>\n市場を分析する\n</thinking>\n<proposal>\nサブスク型の見守りIoT\n</proposal>"

# (case id, completion text, expected score). The seed gives the same score on every one.
SEED_TABLE: list[tuple[str, str, float]] = [
    ("seed example output", GOOD, 1.0),
    ("compact", "<thinking>a</thinking><proposal>b</proposal>", 1.0),
    ("surrounding whitespace", "\n\n  <thinking>a</thinking>\n\n<proposal>b</proposal>  \n", 1.0),
    ("empty tags", "<thinking></thinking><proposal></proposal>", 1.0),
    ("whitespace-only tags", "<thinking> </thinking><proposal>\n</proposal>", 1.0),
    (
        "japanese with punctuation",
        "<thinking>課題：忙しい。</thinking><proposal>「宅配」案</proposal>",
        1.0,
    ),
    ("fenced xml", "```xml\n<thinking>a</thinking>\n<proposal>b</proposal>\n```", 1.0),
    ("fenced bare", "```\n<thinking>a</thinking><proposal>b</proposal>\n```", 1.0),
    ("fence not closed", "```xml\n<thinking>a</thinking><proposal>b</proposal>", 1.0),
    ("escaped entity", "<thinking>R&amp;D</thinking><proposal>a &lt; b</proposal>", 1.0),
    ("numeric entity", "<thinking>&#12354;</thinking><proposal>&#x41;</proposal>", 1.0),
    ("comment inside", "<thinking>a<!-- note --></thinking><proposal>b</proposal>", 1.0),
    ("cdata inside", "<thinking><![CDATA[x]]></thinking><proposal>b</proposal>", 1.0),
    ("text before", "はい。<thinking>a</thinking><proposal>b</proposal>", 0.7),
    ("text after", "<thinking>a</thinking><proposal>b</proposal>以上です。", 0.7),
    ("text between", "<thinking>a</thinking> and <proposal>b</proposal>", 0.7),
    ("nested extra tag", "<thinking><step1>a</step1></thinking><proposal>b</proposal>", 0.7),
    ("nested self-closing", "<thinking>a<br/></thinking><proposal>b</proposal>", 0.7),
    ("tag named in a comment", "<thinking>a<!-- <x> --></thinking><proposal>b</proposal>", 0.7),
    (
        "nested required tag",
        "<thinking>a</thinking><proposal><thinking>b</thinking></proposal>",
        0.7,
    ),
    ("missing proposal", "<thinking>a</thinking>", 0.0),
    ("missing thinking", "<proposal>b</proposal>", 0.0),
    ("plain text", "事業アイディア：見守りサービス", 0.0),
    ("empty string", "", 0.0),
    ("wrong order", "<proposal>b</proposal><thinking>a</thinking>", 0.0),
    (
        "duplicated thinking",
        "<thinking>a</thinking><thinking>c</thinking><proposal>b</proposal>",
        0.0,
    ),
    ("extra top-level tag", "<thinking>a</thinking><proposal>b</proposal><note>c</note>", 0.0),
    ("unclosed thinking", "<thinking>a<proposal>b</proposal></thinking>", 0.0),
    ("closing tag missing", "<thinking>a</thinking><proposal>b", 0.0),
    ("mismatched close", "<thinking>a</proposal><proposal>b</thinking>", 0.0),
    ("unclosed extra tag", "<thinking>a<x></thinking><proposal>b</proposal>", 0.0),
    ("attribute on thinking only", '<thinking lang="ja">a</thinking><proposal>b</proposal>', 0.0),
    (
        "attribute plus plain tags",
        '<thinking>a</thinking><proposal>b</proposal><thinking x="1">c</thinking>',
        0.0,
    ),
    ("upper-case tags", "<THINKING>a</THINKING><PROPOSAL>b</PROPOSAL>", 0.0),
    ("space in tag", "< thinking>a</thinking><proposal>b</proposal>", 0.0),
    ("markdown headings", "## thinking\na\n## proposal\nb", 0.0),
]

# Inputs the seed scores 0.0 only because its XML parser rejects a stray '&' or '<'.
IMPROVED_TABLE: list[tuple[str, str, float]] = [
    ("ampersand", "<thinking>R&D部門</thinking><proposal>B2B&B2C</proposal>", 1.0),
    ("bare less-than", "<thinking>コスト < 売上</thinking><proposal>a < b</proposal>", 1.0),
    ("less-than before digit", "<thinking>x<3</thinking><proposal>b</proposal>", 1.0),
    ("less-than-or-equal", "<thinking>a <= b</thinking><proposal>b</proposal>", 1.0),
    ("comparison chain", "<thinking>if a<b and c>d</thinking><proposal>b</proposal>", 1.0),
    ("stray both", "<thinking>P&L < 0</thinking><proposal>Q&A</proposal>", 1.0),
    ("undefined entity", "<thinking>&nbsp;</thinking><proposal>b</proposal>", 1.0),
    ("invalid char reference", "<thinking>&#0;</thinking><proposal>b</proposal>", 1.0),
    ("ampersand with text outside", "結論<thinking>R&D</thinking><proposal>b</proposal>", 0.7),
    ("ampersand and nested", "<thinking><a>R&D</a></thinking><proposal>b</proposal>", 0.7),
    ("ampersand, wrong order", "<proposal>R&D</proposal><thinking>a</thinking>", 0.0),
    ("ampersand, unclosed tag", "<thinking>R&D<x></thinking><proposal>b</proposal>", 0.0),
]


@pytest.mark.parametrize(
    ("text", "expected"), [c[1:] for c in SEED_TABLE], ids=[c[0] for c in SEED_TABLE]
)
def test_matches_seed_table(text: str, expected: float) -> None:
    assert seed_xml_format_reward([text]) == [expected], "the table itself must be the seed's score"
    assert xml_format_score(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [c[1:] for c in IMPROVED_TABLE], ids=[c[0] for c in IMPROVED_TABLE]
)
def test_stray_ampersand_and_less_than_are_not_parse_failures(text: str, expected: float) -> None:
    assert seed_xml_format_reward([text]) == [0.0]
    assert xml_format_score(text) == expected


def test_table_sizes() -> None:
    assert len(SEED_TABLE) >= 30
    assert {score for _, _, score in SEED_TABLE} == {0.0, 0.7, 1.0}


def _random_answer(rng: random.Random, inner: list[str]) -> str:
    """A mostly well-formed answer; each slot is perturbed with a small probability."""

    def slot(right: str, wrong: list[str], p_wrong: float = 0.12) -> str:
        return rng.choice(wrong) if rng.random() < p_wrong else right

    outside = [" ", "\n", "text", "日本語", "<x>y</x>", "<br/>", "<!-- c -->", "&amp;"]
    body = (
        slot("", outside, 0.2)
        + slot("<thinking>", ['<thinking a="1">', "<proposal>", ""])
        + rng.choice(inner)
        + slot("</thinking>", ["</proposal>", ""])
        + slot("\n", outside, 0.2)
        + slot("<proposal>", ["<thinking>", "<note>", ""])
        + rng.choice(inner)
        + slot("</proposal>", ["</thinking>", "</note>", ""])
        + slot("", outside, 0.2)
    )
    fence = slot("", ["```", "```xml\n"], 0.2)
    return fence + body + (slot("\n```", [""], 0.5) if fence else "")


def test_random_answers_agree_with_seed_without_stray_characters() -> None:
    inner = [
        "",
        "a",
        " 日本語 ",
        "a",
        "b c",
        "<x>y</x>",
        "<br/>",
        "&amp;",
        "<!-- c -->",
        "<thinking>t</thinking>",
    ]
    rng = random.Random(0)
    reached = {0.0: 0, 0.7: 0, 1.0: 0}
    for _ in range(3000):
        text = _random_answer(rng, inner)
        seed_score = seed_xml_format_reward([text])[0]
        # No stray '&' or '<' in these pieces: the seed and grpokit must always agree.
        assert xml_format_score(text) == seed_score, text
        reached[seed_score] += 1
    assert min(reached.values()) > 50, reached


def test_random_stray_characters_only_ever_raise_a_zero() -> None:
    inner = ["a", "R&D", "a < b", "x<3", "&", "<", "<x>y</x>", "&amp;", ""]
    rng = random.Random(1)
    raised = 0
    for _ in range(3000):
        text = _random_answer(rng, inner)
        seed_score = seed_xml_format_reward([text])[0]
        ours = xml_format_score(text)
        if seed_score != 0.0:
            assert ours == seed_score, text
        else:
            raised += ours > 0.0
            # Escaping only stray characters must reproduce the seed on the escaped text.
            escaped = seed_xml_format_reward([escape_stray_markup(strip_code_fences(text))])[0]
            assert ours == escaped, text
    assert raised > 50


def test_custom_tags_and_chat_messages() -> None:
    reward = xml_format(tags=["reasoning", "answer", "confidence"])
    completions = [
        "<reasoning>r</reasoning><answer>4</answer><confidence>0.9</confidence>",
        [{"role": "assistant", "content": "<reasoning>r</reasoning><answer>4</answer>"}],
        [
            {
                "role": "assistant",
                "content": "<reasoning>r</reasoning><answer>4</answer><confidence>1</confidence>",
            }
        ],
        {"content": "<answer>4</answer><reasoning>r</reasoning><confidence>1</confidence>"},
    ]
    assert reward(prompts=["q"] * 4, completions=completions) == [1.0, 0.0, 1.0, 0.0]
    assert reward.__name__ == "xml_format"


def test_extra_keyword_arguments_from_trl_are_ignored() -> None:
    reward = xml_format()
    assert reward(
        prompts=["p"], completions=[GOOD], completion_ids=[[1, 2]], trainer_state=None, answer=["x"]
    ) == [1.0]


@pytest.mark.parametrize("bad", [["<thinking>"], ["1abc"], ["a", "a"], [], ["has space"]])
def test_invalid_tag_parameters(bad: list[str]) -> None:
    with pytest.raises(ValueError):
        XmlFormatParams(tags=bad)


def test_strip_code_fences_and_escape_helpers() -> None:
    assert strip_code_fences("```python\nx\n```") == "x"
    assert strip_code_fences("  no fence  ") == "no fence"
    assert escape_stray_markup("<a>&lt;</a><!-- a < b & c -->") == "<a>&lt;</a><!-- a < b & c -->"
    assert escape_stray_markup("1 < 2 & 3") == "1 &lt; 2 &amp; 3"
    assert escape_stray_markup('<a href="x">t</a>') == '<a href="x">t</a>'


def test_tags_present_partial_credit() -> None:
    assert tags_present_score("", ["a", "b"]) == 0.0
    assert tags_present_score("<a>x</a>", ["a", "b"]) == 0.5
    assert tags_present_score("</a> then <a>", ["a"]) == 0.0  # closed before opened
    assert tags_present_score('<a k="v">x</a><b>y</b>', ["a", "b"]) == 1.0
    assert tags_present_score("<b><a>nested</a></b> junk", ["a", "b"]) == 1.0
    reward = tags_present(tags=["thinking", "answer", "check"])
    assert reward(prompts=None, completions=["<thinking>a</thinking><answer>1"]) == [
        pytest.approx(1 / 3)
    ]
