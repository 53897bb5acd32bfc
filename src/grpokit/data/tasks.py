"""Built-in tasks with checkable answers, generated rather than downloaded (no hub at run time)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

ARITHMETIC_SYSTEM_PROMPT = (
    "You are a careful calculator. Think briefly, then give the result. Reply exactly in this "
    "format:\n<thinking>your working</thinking>\n<answer>the number</answer>"
)


def arithmetic_problems(
    n: int,
    *,
    seed: int,
    exclude: set[tuple[int, int]] | None = None,
    a_range: tuple[int, int] = (10, 99),
    b_range: tuple[int, int] = (10, 99),
) -> list[tuple[int, int]]:
    """n distinct problems (a, b), two-digit numbers unless the (inclusive) ranges say
    otherwise, none of them in `exclude`."""
    rng = random.Random(seed)
    seen = set(exclude or ())
    out: list[tuple[int, int]] = []
    while len(out) < n:
        pair = (rng.randint(*a_range), rng.randint(*b_range))
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
    sets = arithmetic_sets(n_train=n_train, n_heldout=n_heldout, n_demos=n_demos)
    files = {
        "train": [arithmetic_row(a, b) for a, b in sets["train"]],
        "heldout": [arithmetic_row(a, b) for a, b in sets["heldout"]],
        "demos": [demonstration(a, b) for a, b in sets["demos"]],
    }
    return _write_sets(directory, files)


def _write_sets(directory: Path, files: Mapping[str, Sequence[object]]) -> dict[str, Path]:
    """Each set as ``<name>.jsonl`` in ``directory`` (created); their paths by name."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, rows in files.items():
        path = directory / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        paths[name] = path
    return paths


# The tool task: products the embedded model cannot work out in its head, and a calculator.

MULTIPLICATION_SYSTEM_PROMPT = (
    "You are a careful calculator. Reply with the result as <answer>the number</answer>."
)
MULTIPLICATION_RANGES = ((100, 999), (10, 99))
"""Three digits times two: a five-digit product the 135M model almost never gets right alone."""
_MULTIPLICATION_SEED = 100
"""Seeds of the tool task's sets, apart from the addition task's."""


def multiplication_problems(
    n: int, *, seed: int, exclude: set[tuple[int, int]] | None = None
) -> list[tuple[int, int]]:
    """n distinct products a * b, a of three digits and b of two, none of them in `exclude`."""
    a_range, b_range = MULTIPLICATION_RANGES
    return arithmetic_problems(n, seed=seed, exclude=exclude, a_range=a_range, b_range=b_range)


def multiplication_row(a: int, b: int) -> dict[str, str]:
    return {"prompt": f"What is {a} * {b}?", "answer": str(a * b)}


def calculator_demonstration(a: int, b: int) -> dict[str, object]:
    """A tool-using answer to a * b in TRL's conversational form, for the SFT warm-start: a
    ``calculator`` call with the expression, its result, then the answer in ``<answer>`` tags."""
    call = {"name": "calculator", "arguments": {"expression": f"{a} * {b}"}}
    return {
        "prompt": f"What is {a} * {b}?",
        "completion": [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": call}],
            },
            {"role": "tool", "name": "calculator", "content": str(a * b)},
            {"role": "assistant", "content": f"<answer>{a * b}</answer>"},
        ],
    }


def multiplication_sets(
    *, n_train: int = 512, n_heldout: int = 32, n_demos: int = 48
) -> dict[str, list[tuple[int, int]]]:
    """The problems of the tool task's train, heldout and demos: three disjoint sets."""
    heldout = multiplication_problems(n_heldout, seed=_MULTIPLICATION_SEED + 1)
    train = multiplication_problems(n_train, seed=_MULTIPLICATION_SEED + 2, exclude=set(heldout))
    demos = multiplication_problems(
        n_demos, seed=_MULTIPLICATION_SEED + 3, exclude=set(heldout) | set(train)
    )
    return {"train": train, "heldout": heldout, "demos": demos}


def fresh_multiplication_problems(
    n: int, *, seed: int = FRESH_SEED, sizes: dict[str, int] | None = None
) -> list[tuple[int, int]]:
    """n products disjoint from every set ``multiplication_sets`` draws with ``sizes`` (its
    default sizes: the shipped recipe's files): the held-out measure of the tool task."""
    used = {p for problems in multiplication_sets(**(sizes or {})).values() for p in problems}
    return multiplication_problems(n, seed=seed, exclude=used)


def write_multiplication_task(directory: Path, **sizes: int) -> dict[str, Path]:
    """train.jsonl, heldout.jsonl and demos.jsonl of the tool task (``multiplication_sets``
    with ``sizes``); returns their paths."""
    sets = multiplication_sets(**sizes)
    return _write_sets(
        directory,
        {
            "train": [multiplication_row(a, b) for a, b in sets["train"]],
            "heldout": [multiplication_row(a, b) for a, b in sets["heldout"]],
            "demos": [calculator_demonstration(a, b) for a, b in sets["demos"]],
        },
    )
