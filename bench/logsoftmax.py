"""The loss's log-softmax over a large vocabulary: grpokit's kernels against its torch operations
and TRL's selective_log_softmax / entropy_from_logits, on the same logits.

Per repeat, each side in turn: the chosen tokens' log-probabilities (forward), the entropy, and
forward + backward (the gradient with respect to the logits). The logits are a micro-batch's
(8 sequences of rows / 8 positions) in bfloat16, as grpokit's CPU autocast makes them, or
float32 with --dtype float32. Prints the medians with their spread and the paired ratios.

    python bench/logsoftmax.py --threads 1
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    MIN_MEASURED,
    load_average,
    paired_ratios,
    print_paired,
    spread,
    timed,
)

SIDES = ("grpokit", "grpokit-torch-ops", "trl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2048, help="positions of the micro-batch")
    parser.add_argument("--vocab", type=int, default=128_256, help="vocabulary size")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--repeats", type=int, default=MIN_MEASURED)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--smoke", action="store_true", help="a small shape, 1 repeat (tests)")
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.vocab, args.repeats = 64, 5000, 1

    import torch
    from trl.trainer import utils as trl_utils

    from grpokit.core import logprobs

    if args.threads:
        torch.set_num_threads(args.threads)
    if logprobs._kernels() is None:
        raise SystemExit("grpokit's logit kernels did not build (see the log above)")
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    shape = (8, args.rows // 8)
    logits = (3 * torch.randn(*shape, args.vocab, generator=gen)).to(dtype)
    ids = torch.randint(0, args.vocab, shape, generator=gen)
    grad_out = torch.randn(shape, generator=gen)
    print(
        f"log-softmax of {shape[0]} x {shape[1]} positions x {args.vocab:,} vocabulary, "
        f"{args.dtype}; {args.repeats} repeats; {torch.get_num_threads()} thread(s); "
        f"{load_average()}",
        flush=True,
    )
    kernels = logprobs._kernels

    def grpokit_ops(side: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        logprobs._kernels = kernels if side == "grpokit" else (lambda: None)  # type: ignore[assignment]
        return logprobs.selective_log_softmax, logprobs.entropy_from_logits

    def ops(side: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        if side == "trl":
            return trl_utils.selective_log_softmax, trl_utils.entropy_from_logits
        return grpokit_ops(side)

    def forward_backward(logp_fn: Callable[..., Any]) -> float:
        leaf = logits.clone().requires_grad_(True)
        seconds, _ = timed(lambda: logp_fn(leaf, ids).backward(grad_out))
        return seconds

    measures = ("log-probs", "entropy", "forward + backward")
    times: dict[tuple[str, str], list[float]] = {(s, m): [] for s in SIDES for m in measures}
    for repeat in range(args.repeats + 1):  # the first is a warm-up
        for side in SIDES:
            logp_fn, entropy_fn = ops(side)
            with torch.no_grad():
                t_logp, _ = timed(lambda: logp_fn(logits, ids))  # noqa: B023
                t_entropy, _ = timed(lambda: entropy_fn(logits))  # noqa: B023
            t_both = forward_backward(logp_fn)
            if repeat:
                for measure, seconds in zip(measures, (t_logp, t_entropy, t_both), strict=True):
                    times[side, measure].append(seconds)
    logprobs._kernels = kernels  # type: ignore[assignment]
    for measure in measures:
        for side in SIDES:
            print(f"{measure:<20} {side:<18} {spread(times[side, measure], 3)} s")
    pairs = []
    for measure in measures:
        ours = times["grpokit", measure]
        pairs.append(
            (f"{measure}: grpokit / TRL", paired_ratios(ours, times["trl", measure]), "time")
        )
        pairs.append(
            (
                f"{measure}: grpokit / its torch operations",
                paired_ratios(ours, times["grpokit-torch-ops", measure]),
                "time",
            )
        )
    print_paired("grpokit's log-softmax kernels against torch operations", pairs)


if __name__ == "__main__":
    main()
