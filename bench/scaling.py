"""How grpokit's step time grows with num_generations (G) and max_completion_length (L).

One prompt per step, full fine-tuning, beta 0.04 (the seed article's setting) on the embedded
model; G in 4, 8, 16 and L in 64, 128, 256 by default. Sampled completions end at EOS, so the
generated token count is printed next to each time: a step costs roughly a fixed part plus a
part per generated token, and the ratios show how close to that the growth stays.

    python bench/scaling.py                               # the 3 x 3 grid, 1 measured step each
    python bench/scaling.py --smoke                       # tiny model, G 2/4, L 4/8 (the tests)
    python bench/scaling.py --generations 4 8 --lengths 64 --steps 3

Prints one line per point, then the ratios last (each point against the smallest one).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load_average, median, model_path, print_ratios  # noqa: E402
from train_step import SETTINGS, run_grpokit  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=None, help="model dir or name (default: embedded SmolLM2)")
    ap.add_argument("--smoke", action="store_true", help="tiny model and a 2 x 2 grid")
    ap.add_argument("--generations", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--setting", default="full-beta0.04", choices=list(SETTINGS))
    ap.add_argument("--steps", type=int, default=1, help="measured steps per point")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.smoke:
        args.generations, args.lengths = [2, 4], [4, 8]
    args.model_path = model_path(args.smoke, args.model)
    args.prompts, args.gradient_checkpointing, args.top_k = 1, False, 0
    args.device, args.bf16 = "cpu", False
    print(
        f"model {args.model_path}; {args.setting}; {args.steps} measured step(s) per point; "
        f"{load_average()}"
    )
    points: list[tuple[int, int, float, float]] = []
    first = True
    for g in args.generations:
        for length in args.lengths:
            args.num_generations, args.max_completion_length = g, length
            # One warm-up step in the first point only: later points reuse the warm process.
            result = run_grpokit(args, SETTINGS[args.setting], warmup=1 if first else 0)
            first = False
            seconds = median(result["step_times"])
            tokens = g * result["mean_length"]
            points.append((g, length, seconds, tokens))
            print(
                f"G {g:3d}  L {length:4d}  step {seconds:7.2f} s  generated {tokens:7.1f} tokens "
                f"({seconds / max(tokens, 1.0) * 1000:.1f} ms per token; {load_average()})",
                flush=True,
            )
    g0, l0, s0, t0 = points[0]
    ratios = []
    for g, length, seconds, tokens in points[1:]:
        ratios.append(
            (
                f"G {g} L {length} vs G {g0} L {l0}: step time",
                seconds / s0,
                f"generated tokens x{tokens / max(t0, 1.0):.2f}",
            )
        )
    print_ratios("scaling ratios", ratios)


if __name__ == "__main__":
    main()
