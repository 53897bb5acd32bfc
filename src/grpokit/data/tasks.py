"""Built-in tasks with checkable answers, generated rather than downloaded (no hub at run time)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

ARITHMETIC_SYSTEM_PROMPT = (
    "You are a careful calculator. Think briefly, then give the result. Reply exactly in this "
    "format:\n<thinking>your working</thinking>\n<answer>the number</answer>"
)


def arithmetic_problems(
    n: int, *, seed: int, exclude: set[tuple[int, int]] | None = None
) -> list[tuple[int, int]]:
    """n distinct two-digit addition problems (a, b), none of them in `exclude`."""
    rng = random.Random(seed)
    seen = set(exclude or ())
    out: list[tuple[int, int]] = []
    while len(out) < n:
        pair = (rng.randint(10, 99), rng.randint(10, 99))
        if pair not in seen:
            seen.add(pair)
            out.append(pair)
    return out


def arithmetic_row(a: int, b: int) -> dict[str, str]:
    return {"prompt": f"What is {a} + {b}?", "answer": str(a + b)}


def arithmetic_demonstration(a: int, b: int) -> dict[str, str]:
    """A worked answer in the required format (for the SFT warm-start): column addition, units
    then tens (with the carry when there is one), then the whole sum restated."""
    ones = (a % 10) + (b % 10)
    carry = ones // 10
    tens = a // 10 + b // 10 + carry
    working = f"{a % 10} + {b % 10} = {ones}"
    working += (
        f", carry 1. {a // 10} + {b // 10} + 1 = {tens}"
        if carry
        else f". {a // 10} + {b // 10} = {tens}"
    )
    return {
        "prompt": f"What is {a} + {b}?",
        "completion": f"<thinking>{working}. So {a} + {b} = {a + b}.</thinking>\n<answer>{a + b}</answer>",
    }


def write_arithmetic_task(
    directory: Path,
    *,
    n_train: int = 256,
    n_heldout: int = 32,
    n_demos: int = 64,
    seed: int = 0,
    demonstration: Callable[[int, int], dict[str, str]] = arithmetic_demonstration,
) -> dict[str, Path]:
    """train.jsonl, heldout.jsonl and demos.jsonl (written by ``demonstration``), the held-out
    problems disjoint from the others; returns their paths.

    Each set is a prefix of the same set drawn larger, so a larger set only adds problems.
    """
    directory.mkdir(parents=True, exist_ok=True)
    heldout = arithmetic_problems(n_heldout, seed=seed + 1)
    train = arithmetic_problems(n_train, seed=seed + 2, exclude=set(heldout))
    demos = arithmetic_problems(n_demos, seed=seed + 3, exclude=set(heldout))
    files = {
        "train": [arithmetic_row(a, b) for a, b in train],
        "heldout": [arithmetic_row(a, b) for a, b in heldout],
        "demos": [demonstration(a, b) for a, b in demos],
    }
    paths = {}
    for name, rows in files.items():
        path = directory / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        paths[name] = path
    return paths
