"""``logic_tree_depth``: the seed's reward-hacking example, kept as a cautionary recipe.

Seed article 000 rewarded the depth of a ``tree``-style logic tree (branches drawn with ``├─``,
``└─`` and ``│``). The policy learned to drill one branch ever deeper, with filler nodes and long
runs of bare ``│`` lines: depth went up, the tree got worse. The plain variant reproduces that
reward, so the hack can be studied (and the monitors tested against it); do not use it to train
for quality.

``guarded: true`` counts depth only along well-formed, distinct branches (:func:`content_nodes`):
a node whose label is empty or repeats an earlier label (after normalising spaces and
punctuation), or whose marker contradicts the drawing (``├`` with no later sibling, ``└`` with
one), does not count, nor does anything below it; lines of bare ``│`` are ignored. The marker
rule closes the staircase: siblings indented ever further so that each reads as the previous
one's child (what SmolLM2-135M learned on the depth reward: every ``├─`` promised a sibling that
never came). It removes the cheapest hacks, not the incentive itself: any depth reward still
pays for depth.

``logic_tree_quality`` measures what the hack destroys rather than what it buys: the share of a
tree's lines that are such branches. Logged with ``weight: 0`` and evaluated on held-out prompts,
it shows whether a depth-trained policy still draws trees or only pads and stairs them; it says
nothing about whether the branches are good advice.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from grpokit.rewards._base import Reward
from grpokit.rewards.registry import register_reward
from grpokit.rewards.text import completion_text

# A branch line: tree prefix (spaces, │, ASCII |), then ├ or └ and one or more horizontal bars.
_BRANCH_RE = re.compile(r"^(?P<prefix>[ \t│|]*)(?P<marker>[├└][─━-]+)\s*(?P<label>.*)$")


@dataclass(frozen=True)
class TreeNode:
    """One branch line of a drawn tree."""

    column: int
    depth: int
    label: str
    parent: int | None
    """Index of the parent node in the list, None for a top-level branch."""
    last: bool = False
    """Drawn with ``└``: the line claims to be its parent's last child."""


def parse_tree(text: str) -> list[TreeNode]:
    """The branch lines of a ``tree``-style drawing with their depths (1 = top-level branch).

    Depth comes from the column of the ``├``/``└`` marker: a marker right of the current one
    opens a level, one at an earlier column closes levels back to it (as indentation does in
    Python), so uneven indent widths still count one level per step.

    >>> [(n.depth, n.label) for n in parse_tree("root\\n├─ a\\n│  └─ b\\n└─ c")]
    [(1, 'a'), (2, 'b'), (1, 'c')]
    """
    nodes: list[TreeNode] = []
    stack: list[tuple[int, int]] = []  # (column, node index) of the open levels
    for line in text.splitlines():
        match = _BRANCH_RE.match(line.expandtabs(4))
        if match is None:
            continue
        column = len(match.group("prefix"))
        while stack and stack[-1][0] > column:
            stack.pop()
        if stack and stack[-1][0] == column:
            stack.pop()
        parent = stack[-1][1] if stack else None
        last = match.group("marker").startswith("└")
        nodes.append(TreeNode(column, len(stack) + 1, match.group("label").strip(), parent, last))
        stack.append((column, len(nodes) - 1))
    return nodes


def _normalise_label(label: str) -> str:
    kept = [
        ch.casefold()
        for ch in unicodedata.normalize("NFKC", label)
        if not (unicodedata.category(ch).startswith(("P", "Z", "S")) or ch.isspace())
    ]
    return "".join(kept)


def content_nodes(nodes: list[TreeNode]) -> list[bool]:
    """Per node: is it a well-formed branch with content of its own? Its label is non-empty and
    repeats no earlier label (after normalising spaces and punctuation), its marker tells the
    truth (``├`` when a later sibling follows, ``└`` when none does), and its parent is such a
    branch too.

    >>> content_nodes(parse_tree("x\\n├─ a\\n│  └─ a\\n│     └─ c\\n└─ d"))
    [True, False, False, True]
    >>> content_nodes(parse_tree("x\\n├─ a\\n   ├─ b\\n      ├─ c"))  # siblings drawn as stairs
    [False, False, False]
    """
    has_later_sibling = [False] * len(nodes)
    seen_parents: set[int | None] = set()
    for i in range(len(nodes) - 1, -1, -1):
        has_later_sibling[i] = nodes[i].parent in seen_parents
        seen_parents.add(nodes[i].parent)
    seen: set[str] = set()
    valid: list[bool] = []
    for node, later in zip(nodes, has_later_sibling, strict=True):
        key = _normalise_label(node.label)
        valid.append(
            bool(key)
            and key not in seen
            and node.last != later
            and (node.parent is None or valid[node.parent])
        )
        if key:
            seen.add(key)
    return valid


def tree_depth(text: str, *, guarded: bool = False) -> int:
    """Maximum depth of the drawn tree; with ``guarded``, over distinct, non-empty branches only.

    >>> tree_depth("x\\n└─ a\\n   └─ b\\n      └─ c")
    3
    >>> tree_depth("x\\n└─ a\\n   └─ a\\n      └─ c", guarded=True)
    1
    """
    nodes = parse_tree(text)
    if guarded:
        nodes = [n for n, ok in zip(nodes, content_nodes(nodes), strict=True) if ok]
    return max((n.depth for n in nodes), default=0)


def tree_quality(text: str) -> float:
    """Share of the tree's lines that carry content: 0 (no tree, or only padding) .. 1.

    Every non-empty line after the first (the tree's title) is judged; it counts when it is a
    branch that carries content (:func:`content_nodes`). Bare ``│`` lines, prose, repeated or
    empty branches and everything under them count against it; depth itself neither helps nor
    hurts.

    >>> tree_quality("goal\\n├─ a\\n│  └─ b\\n└─ c")
    1.0
    >>> tree_quality("goal\\n├─ a\\n│\\n│  └─ a\\n│\\n└─ c")
    0.4
    >>> tree_quality("no tree at all")
    0.0
    """
    lines = [line for line in text.splitlines() if line.strip()]
    nodes = parse_tree(text)
    if not nodes:
        return 0.0
    # The first line is the title unless it is itself a branch.
    judged = len(lines) - (0 if _BRANCH_RE.match(lines[0].expandtabs(4)) else 1)
    return sum(content_nodes(nodes)) / judged


class LogicTreeDepthParams(BaseModel):
    """Parameters of ``logic_tree_depth``."""

    model_config = ConfigDict(extra="forbid")

    guarded: bool = Field(
        default=False,
        description="Count depth only along distinct, non-empty branches (repeated or empty "
        "labels, and everything under them, do not count).",
    )
    max_depth: int | None = Field(
        default=None,
        ge=1,
        description="If set, the reward is min(depth, max_depth) / max_depth (0..1) instead of "
        "the raw depth.",
    )


class LogicTreeDepth(Reward):
    """The ``logic_tree_depth`` reward (see :func:`logic_tree_depth`)."""

    def __init__(self, params: LogicTreeDepthParams, name: str = "logic_tree_depth") -> None:
        super().__init__(name)
        self.params = params

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[float | None]:
        p = self.params
        scores: list[float | None] = []
        for completion in completions:
            depth = tree_depth(completion_text(completion), guarded=p.guarded)
            if p.max_depth is not None:
                scores.append(min(depth, p.max_depth) / p.max_depth)
            else:
                scores.append(float(depth))
        return scores


def logic_tree_depth(*, guarded: bool = False, max_depth: int | None = None) -> LogicTreeDepth:
    """Depth of a ``├─ └─ │`` logic tree: the seed's example of a reward that gets hacked.

    YAML: ``- {type: logic_tree_depth, guarded: true, max_depth: 6}``.

    >>> hacked = "goal\\n└─ a\\n   └─ a\\n      └─ a\\n         └─ a"
    >>> logic_tree_depth()(prompts=None, completions=[hacked])
    [4.0]
    >>> logic_tree_depth(guarded=True)(prompts=None, completions=[hacked])
    [1.0]
    """
    return LogicTreeDepth(LogicTreeDepthParams(guarded=guarded, max_depth=max_depth))


register_reward(
    "logic_tree_depth",
    LogicTreeDepthParams,
    lambda params, ctx: LogicTreeDepth(params),
    # Unbounded unless max_depth is set; preflight treats None as "no pass rate".
    max_value=None,
)


class LogicTreeQualityParams(BaseModel):
    """Parameters of ``logic_tree_quality`` (none: the rule is fixed, see :func:`tree_quality`)."""

    model_config = ConfigDict(extra="forbid")


class LogicTreeQuality(Reward):
    """The ``logic_tree_quality`` reward (see :func:`tree_quality`)."""

    def __init__(self, name: str = "logic_tree_quality") -> None:
        super().__init__(name)

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[float | None]:
        return [tree_quality(completion_text(c)) for c in completions]


def logic_tree_quality() -> LogicTreeQuality:
    """Share of a logic tree's lines that are well-formed branches with content (0..1): the
    quality signal to watch
    beside a depth reward, with ``weight: 0`` so that it is logged but not optimised.

    YAML: ``- {type: logic_tree_quality, weight: 0}``.

    >>> padded = "goal\\n└─ a\\n│\\n   └─ a\\n      └─ a"
    >>> logic_tree_quality()(prompts=None, completions=["goal\\n├─ a\\n└─ b", padded])
    [1.0, 0.25]
    """
    return LogicTreeQuality()


register_reward(
    "logic_tree_quality",
    LogicTreeQualityParams,
    lambda params, ctx: LogicTreeQuality(),
    max_value=1.0,
)
