"""The generated arithmetic task: worked answers that are right, and disjoint problem sets."""

from __future__ import annotations

import json
import re
from pathlib import Path

from grpokit.data.tasks import (
    MAX_DEMOS,
    arithmetic_demonstration,
    arithmetic_sets,
    fresh_arithmetic_problems,
    write_arithmetic_task,
)

WORKING = re.compile(
    r"<thinking>(\d) \+ (\d) = (\d+)(, carry 1)?\. (\d) \+ (\d)( \+ 1)? = (\d+)\. "
    r"So (\d+) \+ (\d+) = (\d+)\.</thinking>\n<answer>(\d+)</answer>"
)


def test_every_demonstration_works_the_columns_out_correctly() -> None:
    for a in range(10, 100):
        for b in range(10, 100):
            row = arithmetic_demonstration(a, b)
            assert row["prompt"] == f"What is {a} + {b}?"
            text = row["completion"]
            m = WORKING.fullmatch(text)
            assert m, text
            said_carry, added_carry = m.group(4, 7)
            a0, b0, units, a1, b1, tens, a_again, b_again, total, answer = (
                int(g) for i, g in enumerate(m.groups(), 1) if i not in (4, 7)
            )
            carry = units // 10
            assert (a0, b0, a1, b1) == (a % 10, b % 10, a // 10, b // 10)
            assert units == a0 + b0 and bool(said_carry) == bool(added_carry) == bool(carry)
            assert tens == a1 + b1 + carry
            assert (a_again, b_again) == (a, b)
            assert answer == total == a + b == int(f"{tens}{units % 10}")


def _problems(path: Path) -> list[str]:
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines()]


def test_sets_are_disjoint_and_a_larger_set_only_adds_problems(tmp_path: Path) -> None:
    small = write_arithmetic_task(tmp_path / "small", n_demos=16)
    large = write_arithmetic_task(tmp_path / "large", n_demos=300)
    heldout = set(_problems(large["heldout"]))
    assert len(heldout) == 32
    assert not heldout & set(_problems(large["train"]))
    assert not heldout & set(_problems(large["demos"]))
    assert _problems(large["demos"])[:16] == _problems(small["demos"])
    assert _problems(large["train"]) == _problems(small["train"])


def test_the_demonstration_writer_can_be_replaced(tmp_path: Path) -> None:
    def terse(a: int, b: int) -> dict[str, str]:
        return {"prompt": f"What is {a} + {b}?", "completion": f"<answer>{a + b}</answer>"}

    paths = write_arithmetic_task(tmp_path, n_demos=4, demonstration=terse)
    rows = [json.loads(line) for line in paths["demos"].read_text().splitlines()]
    assert len(rows) == 4 and all(r["completion"].startswith("<answer>") for r in rows)


def test_fresh_problems_are_in_no_set_the_demo_can_draw() -> None:
    fresh = fresh_arithmetic_problems(200)
    assert len(set(fresh)) == 200
    for n_heldout in (8, 32, 200):
        sets = arithmetic_sets(n_heldout=n_heldout, n_demos=MAX_DEMOS)
        for problems in sets.values():
            assert not set(fresh) & set(problems)
    assert fresh_arithmetic_problems(50) == fresh[:50]
