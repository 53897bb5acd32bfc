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


FRESH_SEED = 2024
MAX_DEMOS = 2048
"""The most demonstrations a demo may draw: fresh problems avoid that many."""
_HELDOUT_SIZES = (8, 32, 64, 128, 200)


def arithmetic_sets(
    *, n_train: int = 256, n_heldout: int = 32, n_demos: int = 64, seed: int = 0
) -> dict[str, list[tuple[int, int]]]:
    """The problems of train, heldout and demos, the held-out ones disjoint from the others.

    Each set is a prefix of the same set drawn larger, so a larger set only adds problems.
    """
    heldout = arithmetic_problems(n_heldout, seed=seed + 1)
    train = arithmetic_problems(n_train, seed=seed + 2, exclude=set(heldout))
    demos = arithmetic_problems(n_demos, seed=seed + 3, exclude=set(heldout))
    return {"train": train, "heldout": heldout, "demos": demos}


def fresh_arithmetic_problems(n: int, *, seed: int = FRESH_SEED) -> list[tuple[int, int]]:
    """n problems no demo data can contain: disjoint from every train, demos (up to MAX_DEMOS)
    and heldout set (up to 200) that ``arithmetic_sets`` draws with its default seed.

    The demo's large held-out measure: a model is never scored on a problem it trained on,
    whatever the demo's sizes.
    """
    used: set[tuple[int, int]] = set()
    for n_heldout in _HELDOUT_SIZES:
        for problems in arithmetic_sets(n_heldout=n_heldout, n_demos=MAX_DEMOS).values():
            used.update(problems)
    return arithmetic_problems(n, seed=seed, exclude=used)


def write_arithmetic_task(
    directory: Path,
    *,
    n_train: int = 256,
    n_heldout: int = 32,
    n_demos: int = 64,
    demonstration: Callable[[int, int], dict[str, str]] = arithmetic_demonstration,
) -> dict[str, Path]:
    """train.jsonl, heldout.jsonl and demos.jsonl (``arithmetic_sets``, demonstrations written
    by ``demonstration``); returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    sets = arithmetic_sets(n_train=n_train, n_heldout=n_heldout, n_demos=n_demos)
    files = {
        "train": [arithmetic_row(a, b) for a, b in sets["train"]],
        "heldout": [arithmetic_row(a, b) for a, b in sets["heldout"]],
        "demos": [demonstration(a, b) for a, b in sets["demos"]],
    }
    paths = {}
    for name, rows in files.items():
        path = directory / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        paths[name] = path
    return paths
