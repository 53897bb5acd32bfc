"""The demo's experiments: one variant of `grpokit demo` measured on 200 fresh problems.

Each run trains the demo (SFT, then GRPO unless ``--set grpo_steps=0``) with the demo's defaults
changed by ``--set`` and ``--template``, and measures the SFT and GRPO checkpoints on the same
200 two-digit additions, disjoint from every training, demonstration and held-out problem the
demo can draw. The metric is the demo's: pass@1 of the answer (format required) sampled at the
run's temperature, 2 samples per problem with fixed seeds, with the 95% cluster interval over
problems. One JSON line per run is appended to ``--results``; docs/demo.md tabulates them.

    OMP_NUM_THREADS=1 python bench/demo_experiments.py --name base --out /tmp/runs
    python bench/demo_experiments.py --name sft100 --set sft_steps=100 --set grpo_steps=0 ...
    python bench/demo_experiments.py --table results.jsonl     # the table of every run so far
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import REPO, load_average

EVAL_PROBLEMS = 200


def _free_text(a: int, b: int) -> dict[str, str]:
    """No working: the answer stated in a sentence."""
    return {
        "prompt": f"What is {a} + {b}?",
        "completion": f"<thinking>Adding {a} and {b} gives {a + b}.</thinking>\n"
        f"<answer>{a + b}</answer>",
    }


def _columns(a: int, b: int) -> dict[str, str]:
    """Column addition in a fixed terse form: the carry always written, no restated sum."""
    units = a % 10 + b % 10
    carry = units // 10
    tens = a // 10 + b // 10 + carry
    working = f"units {a % 10}+{b % 10}={units}, write {units % 10} carry {carry}. "
    working += f"tens {a // 10}+{b // 10}+{carry}={tens}."
    return {
        "prompt": f"What is {a} + {b}?",
        "completion": f"<thinking>{working}</thinking>\n<answer>{a + b}</answer>",
    }


def templates() -> dict[str, Callable[[int, int], dict[str, str]]]:
    from grpokit.data.tasks import arithmetic_demonstration

    return {"free_text": _free_text, "columns": _columns, "words": arithmetic_demonstration}


def _problems_of(path: Path) -> set[tuple[int, int]]:
    out = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        a, b = json.loads(line)["prompt"].removeprefix("What is ").removesuffix("?").split(" + ")
        out.add((int(a), int(b)))
    return out


def _parse_set(settings: Any, items: list[str]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(settings)}
    changes: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        if key not in fields or key == "demonstration":
            sys.exit(f"--set {item}: unknown setting; one of {sorted(fields)}")
        try:
            value: Any = json.loads(raw) if raw not in ("", "None") else None
        except json.JSONDecodeError:  # a bare word: a string setting (dtype=auto)
            value = raw
        if key in ("lr_scheduler_type", "loss_type", "dtype"):
            value = str(value if value is not None else raw)
        changes[key] = value
    return dataclasses.replace(settings, **changes)


def _git_commit() -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip()


def run(args: argparse.Namespace) -> None:
    import torch

    from grpokit.data.tasks import MAX_DEMOS
    from grpokit.demo import DEMO, run_demo

    torch.set_num_threads(args.threads)
    settings = _parse_set(DEMO, args.set)
    template = templates()[args.template]
    settings = dataclasses.replace(settings, demonstration=template, n_eval=EVAL_PROBLEMS)
    if settings.n_demos > MAX_DEMOS:
        sys.exit(f"n_demos is at most {MAX_DEMOS} (the evaluation set avoids that many)")
    out = Path(args.out) / args.name
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    sft_from = Path(args.sft_from).resolve() if args.sft_from else None
    summary = run_demo(out, settings, measure_base=False, sft_from=sft_from)
    wall = time.perf_counter() - t0
    data = out / "data"
    seen = set().union(*(_problems_of(data / f"{n}.jsonl") for n in ("train", "demos", "heldout")))
    evaluated = _problems_of(data / f"fresh{EVAL_PROBLEMS}.jsonl")
    if seen & evaluated:
        sys.exit(f"evaluation problems overlap the demo's data: {sorted(seen & evaluated)[:5]}")
    record = {
        "name": args.name,
        "template": args.template,
        "changes": args.set
        + ([f"SFT of {Path(args.sft_from).parent.name}"] if args.sft_from else []),
        "commit": _git_commit(),
        "threads": args.threads,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "wall_seconds": wall,
        **{k: summary[k] for k in ("settings", "stages", "seconds", "sft_entropy")},
        **{
            k: summary[k] for k in ("reward_early", "reward_late", "zero_std_share") if k in summary
        },
        "alerts": [a["message"] for a in summary.get("alerts", [])],
    }
    with open(args.results, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(f"== {table_line(record)}")
    print(load_average())


def _answer(record: dict[str, Any], stage: str) -> str:
    r = record["stages"].get(stage)
    if r is None:
        return "-"
    ans = r[1]
    return f"{ans['passed'] / ans['n']:.0%} [{ans['low']:.2f}, {ans['high']:.2f}]"


def table_line(record: dict[str, Any]) -> str:
    sec = record["seconds"]
    changes = ", ".join(record["changes"]) or "defaults"
    # CPU seconds of one thread: comparable across runs whatever else loaded the machine
    grpo = f"{sec['grpo cpu']:.0f}" if "grpo cpu" in sec else "-"
    load = (record["load_before"][0] + record["load_after"][0]) / 2
    share = record.get("zero_std_share")
    zero_std = "-" if share is None else f"{share:.2f}"
    return (
        f"| {record['name']} | {record['template']}; {changes} | {_answer(record, 'after SFT')} "
        f"| {record['sft_entropy']:.2f} | {_answer(record, 'after GRPO')} | {zero_std} "
        f"| {sec.get('sft cpu', 0):.0f} "
        f"| {grpo} | {len(record['alerts'])} | {load:.1f} |"
    )


def table(path: Path) -> None:
    print(
        "| run | change | SFT answer | SFT entropy | GRPO answer | zero-std groups | SFT cpu s "
        "| GRPO cpu s | alerts | load |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for line in path.read_text(encoding="utf-8").splitlines():
        print(table_line(json.loads(line)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", help="Run name (a folder under --out).")
    p.add_argument("--out", default="runs/demo-experiments", help="Where runs are written.")
    p.add_argument("--results", default=None, help="JSONL of results (default OUT/results.jsonl).")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="Change a DemoSettings field (JSON value), e.g. --set sft_steps=100.")  # fmt: skip
    p.add_argument("--template", default="words", choices=sorted(templates()))
    p.add_argument(
        "--sft-from", help="Reuse this sft/ folder of an earlier run (same SFT settings)."
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads.")
    p.add_argument("--table", type=Path, help="Print the table of a results file and exit.")
    args = p.parse_args()
    if args.table:
        table(args.table)
        return
    if not args.name:
        p.error("--name is required")
    args.results = args.results or str(Path(args.out) / "results.jsonl")
    run(args)


if __name__ == "__main__":
    main()
