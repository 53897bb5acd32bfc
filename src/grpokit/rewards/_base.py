"""The contract every reward meets: a named callable with TRL's signature, and its upkeep.

:class:`Reward` is what a :class:`~grpokit.rewards.compose.RewardSet` holds: grpokit's built-in
rewards and the judge derive from it, and a plain function of the user's (TRL's convention) is
wrapped into one by :func:`as_reward`. The set then reads ``required_columns``, ``last_metrics``
and ``close`` directly, never by probing attributes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any


class Reward(ABC):
    """A reward function object: ``reward(prompts=..., completions=..., **columns)``.

    TRL's GRPOTrainer names a reward by its ``__name__`` (``rewards/<name>/mean`` in its logs), so
    instances carry one. Extra keyword arguments that TRL passes (``completion_ids``,
    ``trainer_state``, dataset columns the reward does not use) are accepted and ignored.
    """

    #: Dataset columns this reward reads, checked before training starts.
    required_columns: frozenset[str] = frozenset()
    #: Other rewards of the set whose values (for the same completions) this reward reads; the
    #: set passes them as the keyword ``reward_values`` ({name: [value or None, ...]}).
    reads_rewards: frozenset[str] = frozenset()
    #: Names of the per-completion sub-scores this reward reports in ``last_parts`` (a
    #: checklist's items, ``checklist/<item>``); the set logs ``<part>/pass_rate``.
    part_names: tuple[str, ...] = ()

    def __init__(self, name: str) -> None:
        self.__name__ = name
        #: Metrics about the last call (a judge's parse failures, cache hits ...), logged with
        #: the step's metrics; empty for rewards that report nothing.
        self.last_metrics: dict[str, float] = {}
        #: Each of ``part_names`` -> one value in [0, 1] (or None) per completion of the last
        #: call.
        self.last_parts: dict[str, list[float | None]] = {}

    def __call__(
        self,
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        if completions is None:
            raise TypeError(f"reward {self.__name__!r} was called without completions")
        completions = list(completions)
        prompt_list = list(prompts) if prompts is not None else [None] * len(completions)
        return self.score(prompt_list, completions, columns)

    @abstractmethod
    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[float | None]:
        """One value per completion (None = not applicable)."""

    def close(self) -> None:  # noqa: B027  (most rewards hold nothing to release)
        """Release resources (worker pools, clients). Calling it twice is harmless."""

    def __repr__(self) -> str:
        return f"<grpokit reward {self.__name__}>"


class FunctionReward(Reward):
    """A plain function with TRL's convention, as a :class:`Reward`.

    The function may carry the optional parts of the contract itself, as TRL users' reward
    objects sometimes do: a ``last_metrics`` mapping refreshed per call and a ``close()``.
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
        result = self.fn(prompts=prompts, completions=completions, **columns)
        reported = getattr(self.fn, "last_metrics", None)
        self.last_metrics = dict(reported) if isinstance(reported, dict) else {}
        return result

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[float | None]:
        return list(self(prompts, completions, **columns))

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
