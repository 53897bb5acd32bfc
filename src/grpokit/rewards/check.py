"""``grpokit rewards check``: score hand-written or saved completions with the configured rewards.

A user tests a reward before spending compute on it: write a few completions (good, bad, the
tricky ones) in a JSONL file, one object per line::

    {"prompt": "2+2?", "completion": "<thinking>add</thinking><answer>4</answer>", "answer": "4"}
    {"completion": [{"role": "assistant", "content": "4"}], "answer": "4"}

``completion`` is required (a string or chat messages); ``prompt`` is optional; every other key
is a dataset column (``answer``, ``tests``, ``completion_ids`` ...) handed to the rewards.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from grpokit.errors import UserError
from grpokit.rewards._text import completion_text
from grpokit.rewards.compose import RewardScores, build_reward_set
from grpokit.rewards.registry import BuildContext
from grpokit.rewards.spec import RewardSpec

# Keys of a JSONL row that are not dataset columns.
_RESERVED = ("completion", "prompt")
# Columns the trainer supplies itself rather than the dataset.
_RUNTIME_COLUMNS = frozenset({"completion_ids"})


def read_completions(path: Path) -> list[dict[str, Any]]:
    """Rows of a completions JSONL file; errors name the file and line.

    Raises:
        UserError: missing file, a line that is not a JSON object, or one without ``completion``.
    """
    if not path.is_file():
        raise UserError(f"completions file {path} does not exist")
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise UserError(f"{path}:{number}: not valid JSON: {exc}") from None
            if not isinstance(row, dict):
                raise UserError(f"{path}:{number}: each line must be a JSON object")
            if "completion" not in row:
                raise UserError(
                    f"{path}:{number}: no `completion` key; each line needs at least "
                    '{"completion": "..."}'
                )
            rows.append(row)
    if not rows:
        raise UserError(f"{path} holds no completions (one JSON object per line)")
    return rows


def check_completions(
    specs: list[RewardSpec], completions_path: Path, *, base_dir: Path
) -> tuple[RewardScores, list[dict[str, Any]]]:
    """Score every row of ``completions_path`` with the rewards ``specs`` declare.

    Raises:
        UserError: an unreadable file, or a reward needing a column that no row has.
    """
    rows = read_completions(Path(completions_path))
    keys = sorted({k for row in rows for k in row if k not in _RESERVED})
    columns = {key: [row.get(key) for row in rows] for key in keys}
    prompts = [row.get("prompt") for row in rows]
    completions = [row["completion"] for row in rows]
    reward_set = build_reward_set(specs, BuildContext(base_dir=base_dir, run_dir=None, seed=0))
    try:
        reward_set.check_columns(set(keys) | _RUNTIME_COLUMNS, source=str(completions_path))
        scores = reward_set(prompts, completions, columns)
    finally:
        reward_set.close()
    return scores, rows


def _cell(value: float, gated: bool) -> str:
    text = "None" if math.isnan(value) else f"{value:.3g}"
    return f"{text} (gated)" if gated else text


def _one_line(text: str, max_chars: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= max_chars else flat[: max_chars - 1] + "…"


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
            Text(_one_line(completion_text(row["completion"]), max_chars)),
            *cells,
            "None" if math.isnan(total) else f"{total:.3g}",
        )
    return table
