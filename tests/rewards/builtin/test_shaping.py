"""Length, overlong and repetition penalties, and the seed's logic-tree depth reward."""

from __future__ import annotations

import pytest

from grpokit.errors import UserError
from grpokit.rewards import (
    RewardSpec,
    length_penalty,
    logic_tree_depth,
    logic_tree_quality,
    repetition_penalty,
    soft_overlong_punishment,
)
from grpokit.rewards.builtin.length import repeated_ngram_share, soft_overlong_value
from grpokit.rewards.builtin.logic_tree import parse_tree, tree_depth, tree_quality


def test_soft_overlong_matches_math_md() -> None:
    # L_max = 20, L_cache = 5: 0 up to 15, ((20 - 5) - |o|) / 5 inside the buffer, -1 from 20.
    expected = {0: 0.0, 15: 0.0, 16: -0.2, 18: -0.6, 19: -0.8, 20: -1.0, 25: -1.0}
    for length, value in expected.items():
        assert soft_overlong_value(length, 20, 5) == pytest.approx(value)
    assert soft_overlong_value(20, 20, 0) == 0.0 and soft_overlong_value(21, 20, 0) == -1.0


def test_soft_overlong_reward_units() -> None:
    reward = soft_overlong_punishment(20, 5)
    ids = [[0] * 10, [0] * 18, [0] * 30]
    assert reward(prompts=None, completions=["", "", ""], completion_ids=ids) == pytest.approx(
        [0.0, -0.6, -1.0]
    )
    with pytest.raises(UserError, match="completion_ids"):
        reward(prompts=None, completions=["a"])
    chars = soft_overlong_punishment(4, 2, unit="chars")
    assert chars(prompts=None, completions=["abc", "あいうえお"]) == [-0.5, -1.0]
    with pytest.raises(ValueError, match="must not exceed"):
        RewardSpec.model_validate(
            {"type": "soft_overlong_punishment", "max_completion_len": 4, "soft_punish_cache": 5}
        )


def test_length_penalty() -> None:
    reward = length_penalty(2, per_unit=0.25, unit="words")
    assert reward(prompts=None, completions=["a b", "a b c", "a b c d e f g h"]) == [
        0.0,
        -0.25,
        -1.0,
    ]
    capped = length_penalty(0, per_unit=1.0, max_penalty=0.5, unit="chars")
    assert capped(prompts=None, completions=["", "abc"]) == [0.0, -0.5]


def test_repetition_penalty() -> None:
    assert repeated_ngram_share(list("abcabc"), 3) == pytest.approx(1 - 3 / 4)
    words = repetition_penalty(3)
    looping = "the plan is good " * 10
    varied = "first analyse the market then design a subscription with clear pricing"
    scores = words(prompts=None, completions=[varied, looping, "short"])
    assert scores[0] == 0.0 and scores[2] == 0.0
    assert scores[1] == pytest.approx(-(1 - 4 / 38))
    chars = repetition_penalty(2, unit="chars", max_penalty=0.5)
    assert chars(prompts=None, completions=["ああああ", "あいうえ"]) == [
        pytest.approx(-0.5 * (1 - 1 / 3)),
        0.0,
    ]
    tokens = repetition_penalty(2, unit="tokens")
    assert tokens(prompts=None, completions=["x"], completion_ids=[[1, 2, 1, 2, 1]]) == [-0.5]


# The two trees of seed 000, section 2-2: the base model's answer and the hacked one.
BASE_TREE = """体重減少方法
└─ 健康的な摂取カロリー制限
   ├─ 適切な摂取カロリー目標設定
   │  └─ 個人のエネルギー需要に基づいた設定
   └─ 栄養バランスの取れた食事の組成
      ├─ 炭水化物、蛋白质、脂肪の適切な割合
      │  └─ 低糖質、高タンパク質の組み合わせ
      │     ├─ 野菜と果物の摂取
      │     └─ タンパク源の選択
      │        └─ 鶏肉、豚肉、魚介類、豆類等
      ├─ 適度な脂質の摂取
      │  └─ オリーブオイルやナッツ類の使用
      └─ 水分摂取の重要性
         └─ 適切な水分補給"""

HACKED_TREE = """- 体重減量
  │
  ├─ 目標体重設定
  │
  ├─ 適度なカロリーゼロダイエット
  │
  │   ├── 食べるカロリー制限
  │   │
  │   │   ├── 野菜中心の食事
  │   │   │
  │   │   │   ├── 新鮮な野菜と果物の摂取
  │   │   │   │
  │   │   │   │   ├── 買い物時の新鮮さ確認
  │   │   │   │   │
  │   │   │   │   │   ├── 嫌味のない食材の選択
  │   │   │   │   │   │
  │   │   │   │   │   │ └── カロリーの少ない食材の選択
  │   │   │   │   │   │
  │   │   │   │   │   │ └── 複数の食材を組み合わせて調理する"""


def test_seed_trees() -> None:
    assert tree_depth(BASE_TREE) == 6
    assert tree_depth(HACKED_TREE) == 7  # the hack scores higher than the better tree
    assert len(parse_tree(HACKED_TREE)) == 9  # bare '│' lines are not nodes
    assert tree_depth(BASE_TREE, guarded=True) == 6


def test_guarded_depth_ignores_repeated_and_empty_branches() -> None:
    padded = "x\n└─ 食事\n   └─ 食事。\n      └─ 食 事\n         └─ new"
    assert tree_depth(padded) == 4
    assert tree_depth(padded, guarded=True) == 1  # repeats, and everything under them, don't count
    empty = "x\n└─ a\n   └─ \n      └─ b"
    assert tree_depth(empty) == 3 and tree_depth(empty, guarded=True) == 1
    reward = logic_tree_depth(guarded=True, max_depth=4)
    assert reward(prompts=None, completions=[BASE_TREE, "no tree", padded]) == [1.0, 0.0, 0.25]
    assert logic_tree_depth()(prompts=None, completions=[HACKED_TREE]) == [7.0]


def test_tree_quality_counts_lines_that_carry_content() -> None:
    assert tree_quality(BASE_TREE) == 1.0
    # The hacked tree: 18 lines under the title, half of them bare '│'; from the second branch on
    # each '├' promises a sibling that never comes, so only the first branch is well formed.
    assert tree_quality(HACKED_TREE) == pytest.approx(1 / 18)
    # Siblings drawn as stairs (each one a column further right) are not a decomposition.
    stairs = "goal\n├─ breakfast\n   ├─ lunch\n      ├─ dinner\n         └─ snack"
    assert tree_quality(stairs) == 0.0
    assert tree_quality("goal\n├─ breakfast\n├─ lunch\n├─ dinner\n└─ snack") == 1.0
    # Depth alone neither helps nor hurts: a deep chain of distinct labels is all content.
    chain = "goal\n└─ a\n   └─ b\n      └─ c\n         └─ d"
    assert tree_quality(chain) == 1.0
    # A repeated label, and everything under it, is padding; so is prose around the tree.
    looped = "goal\n├─ plan\n│  └─ plan\n│     └─ new idea\n└─ act\nThat is all."
    assert tree_quality(looped) == pytest.approx(2 / 5)
    # No title line: every line is judged.
    assert tree_quality("├─ a\n└─ b") == 1.0
    assert tree_quality("") == 0.0 and tree_quality("just prose\nmore prose") == 0.0
    reward = logic_tree_quality()
    assert reward(prompts=None, completions=[BASE_TREE, "no tree"]) == [1.0, 0.0]
    spec = RewardSpec.model_validate({"type": "logic_tree_quality", "weight": 0})
    assert spec.weight == 0.0
