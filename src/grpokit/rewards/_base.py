"""The contract every reward meets: a named reward that evaluates a batch, and its upkeep.

:class:`Reward` is what a :class:`~grpokit.rewards.compose.RewardSet` holds: grpokit's built-in
rewards and the judge derive from it, and a plain function of the user's (TRL's convention) is
wrapped into one by :func:`as_reward`. The set hands each reward a :class:`RewardBatch` and reads
what it produced from the :class:`RewardResult` that :meth:`Reward.evaluate` returns (values,
per-completion parts, metrics); it reads ``required_columns``, ``reads_rewards``, ``part_names``
and ``close`` directly, never by probing attributes. A reward keeps nothing about its last call,
so one reward may score two batches at once.

TRL's calling convention, ``reward(prompts=..., completions=..., **columns) -> values``, stays
the way in from outside: :meth:`Reward.__call__` builds the batch and returns its values.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpokit.rewards.judge.reward import JudgedBatch


@dataclass(frozen=True)
class RewardBatch:
    """What one reward scores: B completions and what comes with each of them."""

    prompts: list[Any]
    """B prompts (None where the caller gave none)."""
    completions: list[Any]
    """B completions (text, or chat messages)."""
    columns: Mapping[str, Any] = field(default_factory=dict)
    """The dataset columns and ``completion_ids``, B values each. Called through TRL's
    convention, the other keywords it passes (``trainer_state`` ...) ride here too."""
    reward_values: Mapping[str, list[float | None]] = field(default_factory=dict)
    """For a reward that declares ``reads_rewards``: each of those rewards' B values (None where
    it gave none) for the same completions."""
    environments: Sequence[Any] | None = None
    """B environment instances, one per rollout (``environment_factory``); None without."""

    def select(self, rows: Sequence[int]) -> RewardBatch:
        """The batch of ``rows`` only (every per-completion field restricted to them)."""
        return RewardBatch(
            prompts=[self.prompts[i] for i in rows],
            completions=[self.completions[i] for i in rows],
            columns={k: [v[i] for i in rows] for k, v in self.columns.items()},
            reward_values={k: [v[i] for i in rows] for k, v in self.reward_values.items()},
            environments=(
                None if self.environments is None else [self.environments[i] for i in rows]
            ),
        )

    def keywords(self) -> dict[str, Any]:
        """The keywords a function with TRL's convention gets besides prompts and completions:
        the columns, and ``environments`` when there are environments."""
        if self.environments is None:
            return dict(self.columns)
        return {**self.columns, "environments": self.environments}

    def records(self) -> list[dict[str, Any]]:
        """One record per completion, as ``grpokit rewards check --completions`` reads them
        ({"prompt", "completion", **columns}, and its environment where there are some)."""
        keywords = self.keywords()
        return [
            {"prompt": p, "completion": c, **{k: v[i] for k, v in keywords.items()}}
            for i, (p, c) in enumerate(zip(self.prompts, self.completions, strict=True))
        ]


@dataclass(frozen=True)
class RewardResult:
    """What a reward produced for a :class:`RewardBatch` of B completions."""

    values: list[float | None]
    """B values (None = not applicable). The set checks them (count, numbers, finite) and names
    the reward as configured when they are wrong."""
    parts: dict[str, list[float | None]] = field(default_factory=dict)
    """Each of the reward's ``part_names`` -> B values in [0, 1] (or None)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Metrics about this call (a judge's parse failures, cache hits ...), logged with the
    step's metrics; empty for rewards that report nothing."""
    judged: JudgedBatch | None = None
    """A judge reward's details of this call: each judge's outcome per completion, its group
    requests and its parse-failure warning; None for other rewards."""


class Reward:
    """A reward function object: ``reward.evaluate(batch)``, or with TRL's convention
    ``reward(prompts=..., completions=..., **columns)``.

    A subclass defines :meth:`score` (values only) or :meth:`evaluate` (values and what else it
    reports). TRL's GRPOTrainer names a reward by its ``__name__`` (``rewards/<name>/mean`` in
    its logs), so instances carry one. Extra keyword arguments that TRL passes
    (``completion_ids``, ``trainer_state``, dataset columns the reward does not use) are
    accepted and ignored.
    """

    #: Dataset columns this reward reads, checked before training starts.
    required_columns: frozenset[str] = frozenset()
    #: Other rewards of the set whose values (for the same completions) this reward reads; the
    #: set passes them in ``RewardBatch.reward_values``.
    reads_rewards: frozenset[str] = frozenset()
    #: Names of the per-completion sub-scores this reward reports in ``RewardResult.parts`` (a
    #: checklist's items, ``checklist/<item>``); the set logs ``<part>/pass_rate``.
    part_names: tuple[str, ...] = ()

    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # score and evaluate are each written in terms of the other: one must be the reward's.
        if cls.score is Reward.score and cls.evaluate is Reward.evaluate:
            raise TypeError(f"reward class {cls.__name__} must define score() or evaluate()")

    def __call__(
        self,
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] | None = None,
        *,
        reward_values: Mapping[str, list[float | None]] | None = None,
        environments: Sequence[Any] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        if completions is None:
            raise TypeError(f"reward {self.__name__!r} was called without completions")
        completions = list(completions)
        prompt_list = list(prompts) if prompts is not None else [None] * len(completions)
        batch = RewardBatch(prompt_list, completions, columns, reward_values or {}, environments)
        return self.evaluate(batch).values

    def evaluate(self, batch: RewardBatch) -> RewardResult:
        """Score a batch: its values, and the parts and metrics the reward reports."""
        return RewardResult(self.score(batch.prompts, batch.completions, dict(batch.columns)))

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[float | None]:
        """One value per completion (None = not applicable)."""
        return self.evaluate(RewardBatch(prompts, completions, columns)).values

    def close(self) -> None:
        """Release resources (worker pools, clients). Calling it twice is harmless."""

    def __repr__(self) -> str:
        return f"<grpokit reward {self.__name__}>"


class FunctionReward(Reward):
    """A plain function with TRL's convention, as a :class:`Reward`.

    The function is called with TRL's keywords: the columns, and ``environments=`` when there
    are environments. It may carry the optional parts of the contract itself, as TRL users'
    reward objects sometimes do: a ``last_metrics`` mapping refreshed per call (read into the
    result's metrics after each call) and a ``close()``.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        columns: Sequence[str] = (),
    ) -> None:
        super().__init__(name or getattr(fn, "__name__", None) or type(fn).__name__)
        self.fn = fn
        self.required_columns = frozenset(columns)

    def __call__(
        self,
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] | None = None,
        **columns: Any,
    ) -> Any:
        # Passed through untouched: the set checks what comes back, with the reward's name.
        return self.fn(prompts=prompts, completions=completions, **columns)

    def evaluate(self, batch: RewardBatch) -> RewardResult:
        # What the function returned, unchecked: the set checks it, naming the reward as
        # configured.
        values = self.fn(prompts=batch.prompts, completions=batch.completions, **batch.keywords())
        reported = getattr(self.fn, "last_metrics", None)
        return RewardResult(values, metrics=dict(reported) if isinstance(reported, dict) else {})

    def close(self) -> None:
        close = getattr(self.fn, "close", None)
        if callable(close):
            close()


def as_reward(fn: Reward | Callable[..., Any], *, name: str | None = None) -> Reward:
    """``fn`` itself when it is a :class:`Reward`, else ``fn`` wrapped in a FunctionReward."""
    if isinstance(fn, Reward):
        return fn
    if not callable(fn):
        raise TypeError(f"a reward must be callable, got {fn!r}")
    return FunctionReward(fn, name=name)


class RewardError(RuntimeError):
    """A reward function misbehaved (raised, or returned the wrong number or kind of values).

    ``reward`` names it; ``inputs`` holds what it was called with, one record per completion
    in the form ``grpokit rewards check --completions`` reads ({"prompt", "completion",
    **columns}), so that a failed run can save the batch and the user can replay it.
    """

    def __init__(
        self, message: str, *, reward: str = "", inputs: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(message)
        self.reward = reward
        self.inputs = inputs or []


def check_result(name: str, result: Any, expected: int) -> list[float | None]:
    """What reward ``name`` returned for ``expected`` completions, checked: one finite number
    or None per completion (NaN read as None); a tensor or array is read as its list."""
    if hasattr(result, "tolist"):  # a tensor or numpy array (str and bytes have no tolist)
        result = result.tolist()
    if not isinstance(result, Sequence) or isinstance(result, (str, bytes)):
        raise RewardError(
            f"reward {name!r} returned {type(result).__name__}; it must return a list with one "
            f"float (or None) per completion"
        )
    if len(result) != expected:
        raise RewardError(
            f"reward {name!r} returned {len(result)} values for {expected} completions; "
            "it must return exactly one value (float or None) per completion"
        )
    checked: list[float | None] = []
    for i, value in enumerate(result):
        if value is None:
            checked.append(None)
            continue
        if not isinstance(value, numbers.Real):
            raise RewardError(
                f"reward {name!r} returned {value!r} ({type(value).__name__}) at position {i}; "
                "values must be numbers or None"
            )
        number = float(value)
        if math.isnan(number):
            checked.append(None)
        elif math.isinf(number):
            raise RewardError(
                f"reward {name!r} returned {number} at position {i}; use a finite value"
            )
        else:
            checked.append(number)
    return checked
