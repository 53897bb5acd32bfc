"""``grpokit judge audit-checklist``: does each checklist item tell answers that meet it from
answers that do not?

A checklist item is worth training on only if its check answers its question better than chance.
The audit reads labelled answers: JSONL rows ``{"prompt", "completion", "fails": [items]}``,
where ``fails`` names the items the answer does not meet (empty for a good answer). The useful
labelled set holds good answers and, for each, planted variants that fail one item only (the
item's sentence replaced by a neutral one of about the same length), so that an item's check is
compared on answers that differ in that item alone.

Per item it reports the mean score (a question's probability of yes, a program's 0/1) on the
answers that meet it and on those that fail it; the separation (the share of (meets, fails)
pairs scored in the right order, ties half: the ROC AUC); and, pairing each planted variant
with the good answer it came from (same prompt, ``fails`` empty), the share of pairs where the
good one scored higher, with a one-sided sign test against chance (ties left out).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grpokit.errors import UserError
from grpokit.rewards._base import RewardBatch
from grpokit.rewards.audit.common import audit_config_reward, fmt
from grpokit.rewards.audit.judge import separation
from grpokit.rewards.builtin.checklist import Checklist, ChecklistParams, build_checklist
from grpokit.rewards.registry import BuildContext
from grpokit.rewards.spec import RewardSpec

SIGNIFICANCE = 0.05
"""One-sided level of the sign test below which an item counts as better than chance."""


@dataclass
class ItemAudit:
    """How one item's check scored the labelled answers."""

    item: str
    check: str
    """The kind of check: question, regex, function, json_schema or length."""
    meets_mean: float
    """Mean score on the answers that meet the item."""
    fails_mean: float
    """Mean score on the answers that fail it."""
    meets: int
    fails: int
    separation: float
    """P(an answer that meets the item scores above one that fails it), ties half."""
    pairs: int
    """Planted answers failing this item paired with their good original."""
    paired_wins: float
    """Share of those pairs where the good answer scored higher (ties half)."""
    p_value: float
    """One-sided sign test of the paired wins against chance (ties left out); NaN: no pairs."""
    verdict: str
    """"better than chance" (p < SIGNIFICANCE), "no better than chance", or "no pairs"."""


@dataclass
class ChecklistAudit:
    reward: str
    answers: int
    items: list[ItemAudit]

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, indent=2)


def sign_test(wins: int, losses: int) -> float:
    """One-sided sign test: P(at least ``wins`` of ``wins + losses`` fair coin flips come up
    heads). NaN without flips.

    >>> sign_test(7, 1)
    0.03515625
    """
    n = wins + losses
    if n == 0:
        return math.nan
    return float(sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n)


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def item_audit(
    item: str, check: str, rows: list[dict[str, Any]], scores: list[float | None]
) -> ItemAudit:
    """The figures of one item from the labelled rows and the item's score of each (None: the
    check did not apply)."""
    meets = [
        s for r, s in zip(rows, scores, strict=True) if s is not None and item not in r["fails"]
    ]
    fails = [s for r, s in zip(rows, scores, strict=True) if s is not None and item in r["fails"]]
    good = {
        r["prompt"]: s
        for r, s in zip(rows, scores, strict=True)
        if not r["fails"] and s is not None
    }
    pairs = [
        (good[r["prompt"]], s)
        for r, s in zip(rows, scores, strict=True)
        if item in r["fails"] and s is not None and r["prompt"] in good
    ]
    wins = sum(g > b for g, b in pairs)
    losses = sum(g < b for g, b in pairs)
    ties = len(pairs) - wins - losses
    p_value = sign_test(wins, losses)
    if not pairs:
        verdict = "no pairs"
    elif p_value < SIGNIFICANCE:
        verdict = "better than chance"
    else:
        verdict = "no better than chance"
    return ItemAudit(
        item=item,
        check=check,
        meets_mean=_mean(meets),
        fails_mean=_mean(fails),
        meets=len(meets),
        fails=len(fails),
        separation=separation(meets, fails),
        pairs=len(pairs),
        paired_wins=(wins + 0.5 * ties) / len(pairs) if pairs else math.nan,
        p_value=p_value,
        verdict=verdict,
    )


def audit_checklist_reward(
    reward: Checklist, rows: list[dict[str, Any]], name: str = "checklist"
) -> ChecklistAudit:
    """Score the labelled ``rows`` with ``reward`` once and audit each of its items.

    Raises:
        UserError: a row without ``fails`` (a list), or rows that name no item of the checklist.
    """
    names = [item.name for item in reward.items]
    named: set[str] = set()
    for number, row in enumerate(rows, start=1):
        fails = row.get("fails")
        if not isinstance(fails, list):
            raise UserError(
                f"row {number}: no `fails` list; each row of a checklist audit names the items "
                'the answer does not meet, e.g. "fails": ["kpi"] (empty for a good answer)'
            )
        named |= {str(f) for f in fails}
    # A file may label items of several checklists; one that names none of these has nothing
    # that fails them (a misspelt item, or the wrong file).
    if not named & set(names):
        raise UserError(
            f"no row's `fails` names an item of checklist {name!r} (items: {', '.join(names)}; "
            f"the rows name: {', '.join(sorted(named)) or 'none'}), so no item can be audited"
        )
    reserved = {"prompt", "completion", "fails"}
    keys = sorted({k for row in rows for k in row if k not in reserved})
    columns = {k: [row.get(k) for row in rows] for k in keys}
    result = reward.evaluate(
        RewardBatch(
            [row.get("prompt", "") for row in rows], [row["completion"] for row in rows], columns
        )
    )
    items = [
        item_audit(item.name, item.checks[0], rows, result.parts[f"checklist/{item.name}"])
        for item in reward.items
    ]
    return ChecklistAudit(reward=name, answers=len(rows), items=items)


def audit_checklist(
    specs: list[RewardSpec],
    base_dir: Path,
    completions_path: Path,
    *,
    source: str,
    reward_name: str | None = None,
) -> ChecklistAudit:
    """Build the checklist reward of a config's ``rewards:`` (cache off, its gates left out:
    every labelled answer is checked) and audit it on a labelled completions file."""

    def build(spec: RewardSpec) -> Checklist:
        assert isinstance(spec.params, ChecklistParams)
        items = [item.model_copy(update={"gate": None}) for item in spec.params.items]
        params = spec.params.model_copy(update={"cache": False, "items": items})
        return build_checklist(
            params, BuildContext(base_dir=base_dir), f"reward {spec.display_name!r}"
        )

    def audit(
        reward: Checklist, rows: list[dict[str, Any]], name: str, tags: list[str] | None
    ) -> ChecklistAudit:
        return audit_checklist_reward(reward, rows, name)

    return audit_config_reward(
        specs, "checklist", reward_name, completions_path, source=source, build=build, audit=audit
    )


def print_checklist_audit(report: ChecklistAudit, console: Any = None) -> None:
    """Print the per-item table (rich)."""
    from rich.console import Console
    from rich.table import Table

    out = console if console is not None else Console()
    table = Table(
        title=f"checklist {report.reward!r}: {report.answers} labelled answers, scored once"
    )
    for column in (
        "item",
        "check",
        "meets: mean",
        "fails: mean",
        "separation",
        "good above its variant",
        "sign test p",
        "verdict",
    ):
        table.add_column(column)
    for a in report.items:
        colour = "green" if a.verdict == "better than chance" else "red"
        table.add_row(
            a.item,
            a.check,
            f"{fmt(a.meets_mean)} (n={a.meets})",
            f"{fmt(a.fails_mean)} (n={a.fails})",
            fmt(a.separation, 2),
            f"{fmt(a.paired_wins, 2)} of {a.pairs}",
            fmt(a.p_value, 3),
            f"[{colour}]{a.verdict}[/{colour}]",
        )
    out.print(table)
    out.print(
        "separation: P(an answer meeting the item scores above one failing it), 0.5 = chance; "
        f"verdict: one-sided sign test on the paired answers at p < {SIGNIFICANCE:g}"
    )
