"""Combining the configured rewards: gates, weights, None handling and per-reward metrics.

A :class:`RewardSet` is built once from the config's ``rewards:`` list and called once per batch
of completions. It evaluates the rewards in gate order, sends each gated reward only the
completions that passed its gate, and returns a :class:`RewardScores` whose ``total`` the trainer
turns into advantages (a NaN total, i.e. every reward None for that row, means advantage 0).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.errors import UserError
from grpokit.rewards._base import (
    Reward,
    RewardBatch,
    RewardError,
    RewardResult,
    as_reward,
    check_result,
)
from grpokit.rewards.registry import BuildContext, get_reward_type
from grpokit.rewards.spec import RewardSpec, gate_order, validate_reward_specs


@dataclass
class RewardScores:
    """The rewards of one batch of B completions under F reward functions."""

    names: list[str]
    per_function: torch.Tensor
    """(B, F) float32. NaN = None (not applicable); gated-out rows hold the gate's ``otherwise``
    (NaN if that is None)."""
    gated_out: torch.Tensor
    """(B, F) bool: True where the reward was not computed because its gate stayed closed."""
    total: torch.Tensor
    """(B,) float32: weighted sum over functions ignoring NaN; NaN where a row is all NaN."""
    metrics: dict[str, float]
    """``rewards/<name>/mean`` and ``/std`` over the non-NaN values of ``per_function`` (gated-out
    rows included with their ``otherwise`` value, i.e. what enters the total), ``/none_frac``
    (share of the batch where the reward itself returned None) and ``/gated_out_frac``; and
    ``<part>/pass_rate`` for each reward part (see ``parts``)."""
    parts: dict[str, torch.Tensor] = field(default_factory=dict)
    """Sub-scores some rewards report per completion (a checklist's items, ``checklist/<item>``):
    (B,) float32 each, gated-out rows at their reward's gate ``otherwise``, NaN = None."""
    part_of: dict[str, str] = field(default_factory=dict)
    """The reward (of ``names``) that reported each part."""

    def column(self, name: str) -> list[float | None]:
        """The values of one reward as a list, None for NaN."""
        j = self.names.index(name)
        return [None if math.isnan(v) else v for v in self.per_function[:, j].tolist()]


@dataclass
class _Entry:
    name: str
    fn: Reward
    weight: float
    max_value: float | None
    gate_index: int | None
    gate_min: float
    gate_otherwise: float | None


class RewardSet:
    """The configured rewards, ready to score batches. Build with :func:`build_reward_set`."""

    def __init__(self, entries: list[_Entry], order: list[int]) -> None:
        self._entries = entries
        self._order = order
        self.names: list[str] = [e.name for e in entries]
        self.weights: list[float] = [e.weight for e in entries]
        self.max_values: list[float | None] = [e.max_value for e in entries]
        self.required_columns: set[str] = set().union(*(e.fn.required_columns for e in entries))
        self.columns_of: dict[str, frozenset[str]] = {
            e.name: frozenset(e.fn.required_columns) for e in entries
        }
        """Per reward, the dataset columns it reads."""
        self._index = {name: j for j, name in enumerate(self.names)}
        owners: dict[str, str] = {}
        for entry in entries:
            for part in entry.fn.part_names:
                if part in owners:
                    raise UserError(
                        f"rewards {owners[part]!r} and {entry.name!r} both report {part!r} "
                        "(a checklist item's metric): give their items distinct names"
                    )
                owners[part] = entry.name
        self.part_names: list[str] = list(owners)

    def check_columns(self, available: Iterable[str], *, source: str = "the dataset") -> None:
        """Raise :class:`UserError` if a reward needs a column that ``source`` does not have."""
        have = set(available)
        for entry in self._entries:
            missing = sorted(entry.fn.required_columns - have)
            if missing:
                raise UserError(
                    f"reward {entry.name!r} needs the column(s) {', '.join(missing)}, which "
                    f"{source} does not have (it has: {', '.join(sorted(have)) or 'none'}). "
                    "Add them, or point the reward's column parameter at an existing column."
                )

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        columns: dict[str, list[Any]],
        *,
        environments: Sequence[Any] | None = None,
    ) -> RewardScores:
        """Score a batch. ``columns`` maps a dataset column to one value per completion;
        ``environments``: one environment instance per completion, for the rewards to read."""
        batch = len(completions)
        if len(prompts) != batch:
            raise ValueError(f"got {len(prompts)} prompts for {batch} completions")
        for key, column in columns.items():
            if len(column) != batch:
                raise ValueError(f"column {key!r} has {len(column)} values for {batch} completions")
        if environments is not None and len(environments) != batch:
            raise ValueError(f"got {len(environments)} environments for {batch} completions")
        whole = RewardBatch(prompts, completions, columns, environments=environments)
        width = len(self._entries)
        # float64 while combining, so that gates compare the values the rewards returned.
        values = torch.full((batch, width), math.nan, dtype=torch.float64)
        gated_out = torch.zeros((batch, width), dtype=torch.bool)
        returned_none = torch.zeros((batch, width), dtype=torch.bool)

        parts = {
            name: torch.full((batch,), math.nan, dtype=torch.float64) for name in self.part_names
        }
        own_metrics: dict[int, dict[str, float]] = {}
        for j in self._order:
            entry = self._entries[j]
            if entry.gate_index is None:
                rows = list(range(batch))
            else:
                gate_values = values[:, entry.gate_index]
                # NaN >= x is False: a None upstream keeps the gate closed.
                open_rows = gate_values >= entry.gate_min
                rows = torch.nonzero(open_rows).flatten().tolist()
                closed = ~open_rows
                gated_out[closed, j] = True
                otherwise = math.nan if entry.gate_otherwise is None else entry.gate_otherwise
                values[closed, j] = otherwise
                for part in entry.fn.part_names:
                    parts[part][closed] = otherwise
            if not rows:
                continue
            read = {
                name: [_value(values[row, self._index[name]]) for row in rows]
                for name in entry.fn.reads_rewards
            }
            sub = whole if len(rows) == batch else whole.select(rows)
            checked, result = _call_reward(entry, dataclasses.replace(sub, reward_values=read))
            own_metrics[j] = result.metrics
            for row, value in zip(rows, checked, strict=True):
                if value is None:
                    returned_none[row, j] = True
                else:
                    values[row, j] = value
            for part in entry.fn.part_names:
                reported = result.parts.get(part)
                if reported is None or len(reported) != len(rows):
                    raise RewardError(
                        f"reward {entry.name!r} reported no value of {part!r} for each of its "
                        f"{len(rows)} completions",
                        reward=entry.name,
                    )
                parts[part][rows] = torch.tensor(
                    [math.nan if v is None else float(v) for v in reported], dtype=torch.float64
                )

        weights = torch.tensor(self.weights, dtype=torch.float64)
        present = ~torch.isnan(values)
        weighted = torch.where(present, values * weights, torch.zeros_like(values))
        total = weighted.sum(dim=1)
        total = torch.where(present.any(dim=1), total, torch.full_like(total, math.nan))
        metrics = _metrics(self.names, values, gated_out, returned_none)
        metrics.update(self._reward_own_metrics(own_metrics))
        floats = {name: column.float() for name, column in parts.items()}
        metrics.update(part_pass_rates(floats))
        part_of = {
            part: self.names[j]
            for j, entry in enumerate(self._entries)
            for part in entry.fn.part_names
        }
        return RewardScores(
            list(self.names), values.float(), gated_out, total.float(), metrics, floats, part_of
        )

    def _reward_own_metrics(self, reported: dict[int, dict[str, float]]) -> dict[str, float]:
        """Metrics the rewards called on this batch report about themselves (a judge's parse
        failures, cache hits ...), by reward index, in the order they were called.

        With one such reward they keep their names (e.g. judge/parse_failure_rate); with
        several, each key gets the reward's name after its first part
        (judge/<name>/parse_failure_rate) so they do not collide.
        """
        reporting = [j for j, metrics in reported.items() if metrics]
        out: dict[str, float] = {}
        for j in reporting:
            for key, value in reported[j].items():
                if len(reporting) > 1:
                    head, _, tail = key.partition("/")
                    key = f"{head}/{self.names[j]}/{tail}" if tail else f"{self.names[j]}/{key}"
                out[key] = float(value)
        return out

    def close(self) -> None:
        """Release the rewards' resources (judge clients, worker pools)."""
        for entry in self._entries:
            entry.fn.close()

    def __enter__(self) -> RewardSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def part_pass_rates(parts: dict[str, torch.Tensor]) -> dict[str, float]:
    """``<part>/pass_rate``: the mean of each (B,) part over its non-NaN values (NaN if none).

    A checklist item's values are 0/1 successes or probabilities of success, so the mean is the
    item's success rate (its expected value for probabilities).
    """
    out: dict[str, float] = {}
    for name, column in parts.items():
        present = column[~torch.isnan(column)]
        out[f"{name}/pass_rate"] = float(present.double().mean()) if present.numel() else math.nan
    return out


def _value(value: torch.Tensor) -> float | None:
    number = float(value)
    return None if math.isnan(number) else number


def _call_reward(entry: _Entry, batch: RewardBatch) -> tuple[list[float | None], RewardResult]:
    """What ``entry``'s reward produced for ``batch``, and its values checked."""
    try:
        result = entry.fn.evaluate(batch)
    except UserError:
        raise
    except Exception as exc:
        raise RewardError(
            f"reward {entry.name!r} raised {type(exc).__name__}: {exc}",
            reward=entry.name,
            inputs=batch.records(),
        ) from exc
    try:
        return check_result(entry.name, result.values, len(batch.completions)), result
    except RewardError as exc:  # what came back is wrong: no exception of the reward's own
        raise RewardError(str(exc), reward=entry.name, inputs=batch.records()) from None


def _metrics(
    names: list[str], values: torch.Tensor, gated_out: torch.Tensor, returned_none: torch.Tensor
) -> dict[str, float]:
    batch = values.shape[0]
    metrics: dict[str, float] = {}
    for j, name in enumerate(names):
        column = values[:, j]
        present = column[~torch.isnan(column)]
        count = present.numel()
        mean = present.mean().item() if count else math.nan
        # Bessel-corrected, as TRL's rewards/<name>/std.
        std = present.std(unbiased=True).item() if count > 1 else (0.0 if count == 1 else math.nan)
        metrics[f"rewards/{name}/mean"] = mean
        metrics[f"rewards/{name}/std"] = std
        metrics[f"rewards/{name}/none_frac"] = (
            returned_none[:, j].sum().item() / batch if batch else 0.0
        )
        metrics[f"rewards/{name}/gated_out_frac"] = (
            gated_out[:, j].sum().item() / batch if batch else 0.0
        )
    return metrics


def build_reward_set(specs: list[RewardSpec], ctx: BuildContext) -> RewardSet:
    """Build every configured reward (in declaration order) and the gate evaluation order.

    Raises:
        UserError: a mis-declared list (see :func:`validate_reward_specs`) or a reward whose
            parameters cannot be turned into a function (missing file, bad import path, ...).
    """
    validate_reward_specs(specs)
    index = {spec.display_name: i for i, spec in enumerate(specs)}
    entries: list[_Entry] = []
    try:
        for spec in specs:
            reward_type = get_reward_type(spec.type)
            built = reward_type.build(spec.params, ctx)
            if not callable(built):
                raise RewardError(f"reward type {spec.type!r} built a non-callable {built!r}")
            fn = as_reward(built, name=spec.display_name)
            gate = spec.gate
            entries.append(
                _Entry(
                    name=spec.display_name,
                    fn=fn,
                    weight=spec.weight,
                    max_value=reward_type.max_value_of(spec.params),
                    gate_index=None if gate is None else index[gate.reward],
                    gate_min=1.0 if gate is None else gate.min,
                    gate_otherwise=None if gate is None else gate.otherwise,
                )
            )
    except BaseException:
        for entry in entries:
            entry.fn.close()
        raise
    return RewardSet(entries, gate_order(specs))
