"""``grpokit rewards check``: score hand-written or saved completions with the configured rewards.

A user tests a reward before spending compute on it: write a few completions (good, bad, the
tricky ones) in a JSONL file, one object per line::

    {"prompt": "2+2?", "completion": "<thinking>add</thinking><answer>4</answer>", "answer": "4"}
    {"completion": [{"role": "assistant", "content": "4"}], "answer": "4"}

``completion`` is required (a string or chat messages); ``prompt`` is optional; every other key
is a dataset column (``answer``, ``tests``, ``completion_ids`` ...) handed to the rewards.
"""

from __future__ import annotations

import contextlib
import logging
import math
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from grpokit.errors import UserError
from grpokit.rewards._base import RewardError
from grpokit.rewards.audit.common import read_numbered_completions
from grpokit.rewards.compose import RewardScores, RewardSet, build_reward_set
from grpokit.rewards.registry import BuildContext
from grpokit.rewards.spec import RewardSpec
from grpokit.rewards.text import completion_text, one_line

# Keys of a JSONL row that are not dataset columns.
_RESERVED = ("completion", "prompt")
# Columns the trainer supplies itself rather than the dataset.
_RUNTIME_COLUMNS = frozenset({"completion_ids"})


@dataclass
class CheckResult:
    """What ``rewards check`` found: the scores, the rows scored, and the warnings the rewards
    logged while scoring (e.g. a judge whose replies mostly held no score)."""

    scores: RewardScores
    rows: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)


def check_completions(
    specs: list[RewardSpec], completions_path: Path, *, base_dir: Path
) -> CheckResult:
    """Score every row of ``completions_path`` with the rewards ``specs`` declare.

    Raises:
        UserError: an unreadable file, a reward needing a column that no row has, or a reward
            that raised or returned the wrong number of values (naming the reward, and the row
            when one row makes it raise).
    """
    path = Path(completions_path)
    numbered = read_numbered_completions(path)
    rows = [row for _, row in numbered]
    keys = sorted({k for row in rows for k in row if k not in _RESERVED})
    columns = {key: [row.get(key) for row in rows] for key in keys}
    prompts = [row.get("prompt") for row in rows]
    completions = [row["completion"] for row in rows]
    places = [f"row {i} ({path}:{line})" for i, (line, _) in enumerate(numbered, start=1)]
    reward_set = build_reward_set(specs, BuildContext(base_dir=base_dir, run_dir=None, seed=0))
    try:
        reward_set.check_columns(set(keys) | _RUNTIME_COLUMNS, source=str(path))
        with _logged_warnings() as warnings:
            scores = _score(reward_set, prompts, completions, columns, places)
    finally:
        reward_set.close()
    return CheckResult(scores, rows, list(dict.fromkeys(warnings)))


@contextlib.contextmanager
def _logged_warnings() -> Iterator[list[str]]:
    """Collect the warnings rewards log (instead of letting them reach stderr unformatted)."""
    collected: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            collected.append(record.getMessage())

    handler = _Collect(level=logging.WARNING)
    logger = logging.getLogger("grpokit.rewards")
    logger.addHandler(handler)
    try:
        yield collected
    finally:
        logger.removeHandler(handler)


def _score(
    reward_set: RewardSet,
    prompts: list[Any],
    completions: list[Any],
    columns: dict[str, list[Any]],
    places: list[str],
) -> RewardScores:
    """Score the batch; a misbehaving reward becomes one :class:`UserError`.

    When a reward raised, the rows are scored one at a time to name the first row it raises on
    (a reward may raise only on the whole batch; then no row is named).
    """
    try:
        return reward_set(prompts, completions, columns)
    except RewardError as exc:
        if exc.__cause__ is None:  # a wrong count or kind of values: a property of the batch
            raise UserError(f"{exc} (scoring the {len(completions)} completions)") from None
        for i, place in enumerate(places):
            try:
                reward_set([prompts[i]], [completions[i]], {k: [v[i]] for k, v in columns.items()})
            except RewardError as one:
                if one.__cause__ is not None:
                    raise UserError(f"{one}{_raised_at(one.__cause__)} on {place}") from None
        raise UserError(
            f"{exc}{_raised_at(exc.__cause__)} on the batch of {len(completions)} completions "
            "(on no single row alone)"
        ) from None


def _raised_at(error: BaseException) -> str:
    """ " (at file:line in function)" of the innermost frame of a reward's exception."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {last.filename}:{last.lineno} in {last.name})"


def _cell(value: float, gated: bool) -> str:
    text = "None" if math.isnan(value) else f"{value:.3g}"
    return f"{text} (gated)" if gated else text


def score_records(scores: RewardScores) -> list[dict[str, Any]]:
    """One JSON-ready record per completion (``--json``): its 1-based row, each reward's score
    (None where it did not apply), the rewards its gates kept out, and the total (None when no
    reward applied)."""
    values, gated = scores.per_function.tolist(), scores.gated_out.tolist()
    records = []
    for i, total in enumerate(scores.total.tolist()):
        records.append(
            {
                "row": i + 1,
                "rewards": {
                    name: None if math.isnan(v) else v
                    for name, v in zip(scores.names, values[i], strict=True)
                },
                "gated_out": [n for n, g in zip(scores.names, gated[i], strict=True) if g],
                "total": None if math.isnan(total) else total,
            }
        )
    return records


def format_table(scores: RewardScores, rows: list[dict[str, Any]], *, max_chars: int = 60) -> Table:
    """A table: one line per completion, one column per reward, the weighted total, and a footer
    with each reward's mean, share of None and share gated out."""
    table = Table(show_footer=True, title="reward check")
    table.add_column("#", justify="right")
    table.add_column("completion", overflow="fold", footer="mean\nshare None / gated out")
    for name in scores.names:
        m = scores.metrics
        footer = (
            f"{m[f'rewards/{name}/mean']:.3g}\n"
            f"{m[f'rewards/{name}/none_frac']:.0%} / {m[f'rewards/{name}/gated_out_frac']:.0%}"
        )
        table.add_column(name, justify="right", footer=footer)
    totals = [t for t in scores.total.tolist() if not math.isnan(t)]
    total_footer = f"{sum(totals) / len(totals):.3g}" if totals else "None"
    table.add_column("total", justify="right", style="bold", footer=total_footer)
    values = scores.per_function.tolist()
    gated = scores.gated_out.tolist()
    for i, row in enumerate(rows):
        cells = [_cell(v, g) for v, g in zip(values[i], gated[i], strict=True)]
        total = scores.total[i].item()
        table.add_row(
            str(i + 1),
            # Text, not a str: completions may contain [brackets] that rich would read as markup.
            Text(one_line(completion_text(row["completion"]), max_chars)),
            *cells,
            "None" if math.isnan(total) else f"{total:.3g}",
        )
    return table
