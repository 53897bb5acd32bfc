from __future__ import annotations

import pytest

from grpokit.monitor.text_stats import repeated_ngram_frac, text_stats, tokenize


def test_tokenize_splits_cjk_per_character_and_keeps_words() -> None:
    assert tokenize("体重を減らす tips: eat less") == [
        "体", "重", "を", "減", "ら", "す", "tips:", "eat", "less",
    ]  # fmt: skip
    # Tree branches are not CJK: they stay whole tokens.
    assert tokenize("├─ 目標\n│  └─ x") == ["├─", "目", "標", "│", "└─", "x"]
    assert tokenize("カロリー、ゼロ。") == ["カ", "ロ", "リ", "ー", "、", "ゼ", "ロ", "。"]


def test_repeated_ngram_frac_hand_computed() -> None:
    # trigrams: abc bca cab abc -> the last repeats the first
    assert repeated_ngram_frac(["a", "b", "c", "a", "b", "c"], 3) == pytest.approx(0.25)
    assert repeated_ngram_frac(["a", "b"], 3) is None
    assert repeated_ngram_frac(["a", "a", "a", "a"], 2) == pytest.approx(2 / 3)


def test_text_stats_hand_computed_batch() -> None:
    stats = text_stats(["a b c a b c", "x y", "same", "  same\n"], group_size=2, n=3)
    # only the first completion has trigrams (share 0.25); shorter ones do not count
    assert stats["completions/repeated_ngram_frac"] == pytest.approx(0.25)
    # bigrams ab bc ca ab bc xy: 4 distinct of 6
    assert stats["completions/distinct_2"] == pytest.approx(4 / 6)
    # second group: both completions are "same" once stripped
    assert stats["completions/max_group_duplicate_frac"] == pytest.approx(1.0)


def test_text_stats_japanese_endless_tree_is_repetitive() -> None:
    healthy = "体重減少\n├─ 食事の改善\n│  └─ 野菜を増やす\n└─ 運動習慣\n   └─ 毎日歩く"
    hacked = "体重減量\n" + "│   │   ├── カロリーの少ない食材の選択\n" * 6
    h = text_stats([healthy], 1)
    k = text_stats([hacked], 1)
    assert h["completions/repeated_ngram_frac"] < 0.1
    assert k["completions/repeated_ngram_frac"] > 0.7
    assert k["completions/distinct_2"] < h["completions/distinct_2"]


def test_group_duplicate_is_max_over_groups() -> None:
    texts = ["a", "b", "c", "d", "x", "x", "x", "y"]
    assert text_stats(texts, 4)["completions/max_group_duplicate_frac"] == pytest.approx(0.75)
    assert text_stats(texts[:4], 4)["completions/max_group_duplicate_frac"] == pytest.approx(0.25)


def test_text_stats_without_bigrams_and_bad_groups() -> None:
    stats = text_stats(["", "ok"], 2)
    assert stats["completions/distinct_2"] == 1.0
    assert stats["completions/repeated_ngram_frac"] == 0.0
    with pytest.raises(ValueError, match="groups of 4"):
        text_stats(["a", "b", "c"], 4)
