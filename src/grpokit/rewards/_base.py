"""The common shape of grpokit's built-in rewards: a named callable with TRL's signature."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any


class Reward(ABC):
    """A reward function object: ``reward(prompts=..., completions=..., **columns)``.

    TRL's GRPOTrainer names a reward by its ``__name__`` (``rewards/<name>/mean`` in its logs), so
    instances carry one. Extra keyword arguments that TRL passes (``completion_ids``,
    ``trainer_state``, dataset columns the reward does not use) are accepted and ignored.
    """

    #: Dataset columns this reward reads, checked before training starts.
    required_columns: frozenset[str] = frozenset()

    def __init__(self, name: str) -> None:
        self.__name__ = name

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
