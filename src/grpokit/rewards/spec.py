"""The ``rewards:`` section of the YAML config.

Each entry is flat: ``type``, optional ``name``, ``weight`` and ``gate``, and the type's own
parameters next to them::

    rewards:
      - type: xml_format
        tags: [thinking, answer]
      - type: math_answer
        answer_column: answer
        gate: {reward: xml_format, min: 1.0}

The type's parameters are validated by the type's params model when the entry is read, so a
misspelt key or a wrong value is reported with the entry's name before anything runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from grpokit.errors import UserError
from grpokit.rewards.registry import get_reward_type

_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


class GateSpec(BaseModel):
    """Compute a reward only where another reward reached a threshold.

    The seed's two-stage design, "judge only answers whose format is perfect", is
    ``gate: {reward: xml_format, min: 1.0}`` on the judge. Completions that fail the gate are never
    sent to the gated reward (it may be an expensive judge); they get ``otherwise``.
    """

    model_config = ConfigDict(extra="forbid")

    reward: str = Field(description="Name of the reward this one depends on (an entry's `name`).")
    min: float = Field(
        default=1.0,
        description="The gate opens where that reward is >= this value. A None (not applicable) "
        "value of that reward keeps the gate closed.",
    )
    otherwise: float | None = Field(
        default=0.0,
        description="Value given to completions that do not pass the gate; null makes them "
        "'not applicable' (ignored in the sum, as a None reward).",
    )


class RewardSpec(BaseModel):
    """One entry of the config's ``rewards:`` list: a reward type, its weight, gate and params."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(
        description="A registered reward type (e.g. xml_format, math_answer, code_tests, judge) "
        "or `python` for your own function given as `function: module:name`."
    )
    name: str | None = Field(
        default=None,
        description="Name of this reward in metrics (rewards/<name>/mean) and in gates; defaults "
        "to the type (for `type: python`, to the function's name). Must be unique in the list.",
    )
    weight: float = Field(
        default=1.0,
        description="Weight of this reward in the total (TRL's reward_weights, per function).",
    )
    gate: GateSpec | None = Field(
        default=None,
        description="Compute this reward only where another reward meets a threshold.",
    )

    _params: BaseModel = PrivateAttr()

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str | None) -> str | None:
        if name is not None and not _NAME_RE.match(name):
            raise ValueError(
                f"reward name {name!r} may contain only letters, digits, '_', '.' and '-' "
                "(it becomes part of metric names such as rewards/<name>/mean)"
            )
        return name

    @field_validator("weight")
    @classmethod
    def _finite_weight(cls, weight: float) -> float:
        if not math.isfinite(weight):
            raise ValueError(f"weight must be a finite number, got {weight}")
        return weight

    @model_validator(mode="after")
    def _validate_params(self) -> RewardSpec:
        label = self.display_name
        try:
            reward_type = get_reward_type(self.type)
        except UserError as exc:
            raise ValueError(f"reward {label!r}: {exc}") from None
        raw = dict(self.model_extra or {})
        try:
            self._params = reward_type.params_model.model_validate(raw)
        except pydantic.ValidationError as exc:
            raise ValueError(_params_error(label, reward_type.params_model, exc)) from None
        if self.name is None and not _NAME_RE.match(self.type):
            raise ValueError(f"reward type {self.type!r} is not a valid metric name; set `name`")
        return self

    @property
    def display_name(self) -> str:
        """The reward's name in metrics and gates: ``name``; else, for ``type: python``, the
        function's name (as TRL names reward functions); else the type."""
        if self.name is not None:
            return self.name
        if self.type == "python":
            function = (self.model_extra or {}).get("function")
            if isinstance(function, str) and ":" in function:
                return function.rsplit(":", 1)[1].rsplit(".", 1)[-1].strip()
        return self.type

    @property
    def depends_on(self) -> list[str]:
        """Names of the rewards this one reads: its gate's and, for a type whose parameters
        gate parts of it on other rewards (a checklist's items), theirs
        (``params.reward_dependencies()``)."""
        names = [] if self.gate is None else [self.gate.reward]
        own = getattr(self._params, "reward_dependencies", None)
        if callable(own):
            names += [name for name in own() if name not in names]
        return names

    @property
    def params(self) -> BaseModel:
        """The type's parameters, parsed and validated by its params model."""
        return self._params


def _params_error(label: str, model: type[BaseModel], exc: pydantic.ValidationError) -> str:
    known = ", ".join(model.model_fields) or "(none)"
    lines = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "(parameters)"
        if error["type"] == "extra_forbidden":
            lines.append(f"unknown parameter {field!r}; this type's parameters are: {known}")
        elif error["type"] == "missing":
            lines.append(f"missing required parameter {field!r}")
        else:
            message = str(error["msg"]).removeprefix("Value error, ")
            lines.append(f"parameter {field!r}: {message}")
    return f"reward {label!r}: " + "; ".join(lines)


def validate_reward_specs(specs: Sequence[RewardSpec]) -> None:
    """Cross-entry checks: non-empty list, unique names, gates on existing rewards, no cycles.

    Raises:
        UserError: naming the offending entry and what to change.
    """
    if not specs:
        raise UserError(
            "`rewards:` is empty; declare at least one reward (e.g. `- type: xml_format`)"
        )
    names = [spec.display_name for spec in specs]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise UserError(
                f"two rewards are named {name!r}; give each entry a distinct `name:` "
                "(the name defaults to the type)"
            )
        seen.add(name)
    for spec in specs:
        for target in spec.depends_on:
            if target == spec.display_name:
                raise UserError(
                    f"reward {spec.display_name!r} is gated on itself; gate it on another"
                )
            if target not in seen:
                raise UserError(
                    f"reward {spec.display_name!r} is gated on {target!r}, which is not a "
                    f"reward in this list; known names: {', '.join(names)}"
                )
    cycle = _find_gate_cycle({s.display_name: s.depends_on for s in specs})
    if cycle is not None:
        raise UserError(
            "reward gates form a cycle: " + " -> ".join(cycle) + "; a gate must depend on a "
            "reward computed before it"
        )


def _find_gate_cycle(depends_on: dict[str, list[str]]) -> list[str] | None:
    """A cycle in the 'gated on' graph, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for parent in depends_on.get(node, []):
            cycle = visit(parent, [*path, node])
            if cycle is not None:
                return cycle
        done.add(node)
        return None

    for start in depends_on:
        found = visit(start, [])
        if found is not None:
            return found
    return None


def gate_order(specs: Sequence[RewardSpec]) -> list[int]:
    """Indices of ``specs`` so that every reward comes after the rewards its gates read.

    Stable: without gates the order is the declared one. Call after :func:`validate_reward_specs`.
    """
    index = {spec.display_name: i for i, spec in enumerate(specs)}
    order: list[int] = []
    placed: set[int] = set()

    def place(i: int) -> None:
        if i in placed:
            return
        for target in specs[i].depends_on:
            place(index[target])
        placed.add(i)
        order.append(i)

    for i in range(len(specs)):
        place(i)
    return order


def parse_reward_specs(raw: Any, *, source: str = "rewards") -> list[RewardSpec]:
    """Validate a raw ``rewards:`` list (from YAML) into specs, with cross-entry checks.

    Errors become :class:`UserError` naming ``source``, the entry index and the field.
    """
    if not isinstance(raw, list):
        raise UserError(f"{source}: `rewards:` must be a list of reward entries")
    specs: list[RewardSpec] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise UserError(f"{source}: rewards[{i}] must be a mapping with at least `type:`")
        try:
            specs.append(RewardSpec.model_validate(entry))
        except pydantic.ValidationError as exc:
            details = "; ".join(
                (".".join(str(p) for p in e["loc"]) + ": " if e["loc"] else "")
                + str(e["msg"]).removeprefix("Value error, ")
                for e in exc.errors()
            )
            raise UserError(f"{source}: rewards[{i}]: {details}") from None
    validate_reward_specs(specs)
    return specs
