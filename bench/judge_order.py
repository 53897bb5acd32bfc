"""A checklist's questions asked completion by completion against item by item, on llama.cpp's
server (grpokit's ``backend: llama_server``, one slot).

    python bench/judge_order.py [--model qwen2.5-coder-1.5b-instruct] [--answers N] [--repeats 6]

The same judge prompts (the business-ideas recipe's four questions about N labelled answers of
``audit_items_en.jsonl``) are sent in the two orders, alternating, each repeat on the same
server; the ratio is item-by-item time over completion-by-completion time, repeat by repeat. The
replies must agree: the order changes what the server reads, not what it is asked. They agree
closely, not exactly: a prefix taken from the cache was read in other batch shapes than a fresh
prompt, which moves the logits a little (the largest P(yes) difference is printed: 0.011 on the
embedded 135M model); the script stops above 0.05, which no such rounding explains and a
mismatched pairing would. ``--smoke`` runs two answers on the embedded model, once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import MIN_MEASURED, print_paired, spread  # noqa: E402

from grpokit.recipes import recipe_dir  # noqa: E402
from grpokit.rewards.judge.backends.served import ServedBackend  # noqa: E402
from grpokit.rewards.judge.config import LlamaServerJudge  # noqa: E402
from grpokit.rewards.judge.yes_no import yes_probability  # noqa: E402

QUESTIONS = [
    "Does the proposal mention a price or a billing scheme?",
    "Does the proposal describe its intended customer concretely?",
    "Does the proposal give KPIs that fit the business?",
    "Is the business's competitive advantage convincing?",
]


def prompts(n: int) -> list[list[str]]:
    """prompts[answer][question]: the recipe's judge prompts for the first ``n`` answers."""
    rows = (recipe_dir("business-ideas") / "audit_items_en.jsonl").read_text().splitlines()
    answers = [json.loads(line)["completion"] for line in rows[:n]]
    return [
        [f"Business proposal:\n{a}\n\nQuestion: {q} Answer yes or no.\nAnswer:" for q in QUESTIONS]
        for a in answers
    ]


def ask(backend: ServedBackend, texts: list[str]) -> tuple[float, dict[str, float | None]]:
    started = time.perf_counter()
    replies = backend.complete(texts, logprobs=True)
    seconds = time.perf_counter() - started
    read = {
        t: (None if r.text is None else yes_probability(r.text, r.tokens or ()))
        for t, r in zip(texts, replies, strict=True)
    }
    return seconds, read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--answers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=MIN_MEASURED)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.answers, args.repeats = "smollm2-135m-instruct", 2, 1
    table = prompts(args.answers)
    by_answer = [p for row in table for p in row]
    by_item = [row[q] for q in range(len(QUESTIONS)) for row in table]
    spec = LlamaServerJudge(
        backend="llama_server", model=args.model, threads=args.threads, max_tokens=2
    )
    backend = ServedBackend(spec, where="bench", base_dir=None)
    item_times: list[float] = []
    answer_times: list[float] = []
    worst = 0.0
    try:
        ask(backend, by_answer[: len(QUESTIONS)])  # warm-up: the model's first pages
        for repeat in range(args.repeats):
            # Alternate which order goes first, so neither always follows the other.
            orders = [("item", by_item), ("answer", by_answer)]
            if repeat % 2:
                orders.reverse()
            read: dict[str, dict[str, float | None]] = {}
            for name, texts in orders:
                seconds, read[name] = ask(backend, texts)
                (item_times if name == "item" else answer_times).append(seconds)
            for text, p in read["item"].items():
                q = read["answer"][text]
                if (p is None) != (q is None):
                    raise SystemExit(f"the two orders disagree on whether {text[:60]!r} answered")
                if p is not None and q is not None:
                    worst = max(worst, abs(p - q))
    finally:
        backend.close()
    if worst > 0.05:
        raise SystemExit(f"P(yes) differs by {worst:.2g} between the two orders")
    n = len(by_answer)
    print(
        f"{args.model}, {args.answers} answers x {len(QUESTIONS)} questions = {n} requests, "
        f"{args.threads} threads; largest P(yes) difference between orders {worst:.1e}"
    )
    print(f"item by item:             {spread(item_times)} s a pass, {n / min(item_times):.2f}/s")
    print(
        f"completion by completion: {spread(answer_times)} s a pass, {n / min(answer_times):.2f}/s"
    )
    ratios = [a / b for a, b in zip(item_times, answer_times, strict=True)]
    print_paired(
        "judge questions, item by item over completion by completion",
        [("time of a pass, item-major / completion-major", ratios, "higher: the order pays")],
    )


if __name__ == "__main__":
    main()
