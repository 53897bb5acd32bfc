"""How grpokit's step time grows with num_generations (G) and max_completion_length (L), and
how the update's log-prob memory grows with L and the vocabulary.

Step time: one prompt per step, full fine-tuning, beta 0.04 (the seed article's setting) on the
embedded model; G in 4, 8, 16 and L in 64, 128, 256 by default. Sampled completions end at EOS, so
the generated token count is printed next to each time: a step costs roughly a fixed part plus a
part per generated token, and the ratios show how close to that the growth stays.

Memory (``--memory``): the training forward and backward of one micro-batch (``--rows``
completions of L tokens sharing a 16-token prompt, full fine-tuning, float32) through
``completion_logprobs`` on a tiny model (2 layers of width 64) with a Llama 3-sized vocabulary
(128,256), once per ``training.logprob_chunk_size`` (0: all positions projected at once, the
(rows x L x V) logits kept for the backward). Each point runs in a fresh process; its peak
resident memory, less the resident memory before the forward (the model, the batch, the
libraries), is what the log-probs cost. The tiny body makes the logits nearly all of it.

    python bench/scaling.py                               # the 3 x 3 grid, 1 measured step each
    python bench/scaling.py --smoke                       # tiny model, G 2/4, L 4/8 (the tests)
    python bench/scaling.py --generations 4 8 --lengths 64 --steps 3
    python bench/scaling.py --memory                      # L 256 / 1,024, chunks 0 / 256 / 1,024
    python bench/scaling.py --memory --smoke              # vocabulary 4,096, L 16 (the tests)

Against TRL (``--vs-trl``): seconds per step and peak memory of grpokit and TRL's GRPOTrainer on
a realistic vocabulary, G = 8 completions of one prompt, completions of 256 / 1,024 / 2,048 tokens.
The model is a random-weight Llama built here (nothing downloaded): Llama 3's vocabulary size
(128,256) with an untied output layer, and a narrow body (8 layers of width 512, 155M
parameters in all, 131M of them the two vocabulary matrices; ``--width`` and ``--layers`` change
the body), so that the vocabulary's share of the work is large, as in a 1B model, and a CPU can
run it. Its end-of-sequence rows are zeroed and
decoding is greedy (bench/gpu_check.py's models), so every completion is exactly L tokens on both
sides: the same work. Each (length, library) runs in a fresh process through
bench/train_step.py's harness (grpokit with ``model.dtype: auto``, TRL in float32, both full
fine-tuning), one warm-up and ``--steps`` measured steps; step k of one is paired with step k of
the other.

    python bench/scaling.py --vs-trl --threads 1 --steps 3            # L 256 / 1,024 / 2,048
    python bench/scaling.py --vs-trl --lengths 256 1024 --steps 3     # without 2,048
    python bench/scaling.py --vs-trl --smoke                          # tiny model (the tests)
    python bench/scaling.py --vs-trl --lengths 1024 --gradient-checkpointing   # both recompute

Padding-free (``--packing``): the update's forward and backward of one micro-batch of 8
completions (one chat prompt, lengths spread evenly from L/8 to L, as sampled completions
differ), padded (prompt encoded once per group, the default; and plain rows) against packed
(``training.padding_free``), the three interleaved, ``--steps`` repeats after a warm-up.

    python bench/scaling.py --packing --lengths 128 512 --steps 5

Prints one line per point, then the ratios last (each point against the smallest one; with
``--memory``, each chunk size's peak against all positions at once; with ``--vs-trl``, grpokit
against TRL per length).
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    chat_prompts,
    emit_result,
    load_average,
    median,
    model_path,
    paired_ratios,
    peak_rss_since_reset_mib,
    print_paired,
    print_ratios,
    reset_peak_rss_mib,
    run_child,
    spread,
    verdict,
)
from train_step import SETTINGS, TARGET_TIME, run_grpokit  # noqa: E402

LLAMA3_VOCAB = 128_256
PROMPT_TOKENS = 16

VOCAB_SHAPE: dict[str, Any] = {
    "vocab_size": LLAMA3_VOCAB,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rope_theta": 500000.0,
}
"""--vs-trl's model: Llama 3's vocabulary and attention layout (grouped keys and values, 4 query
heads per key head) on a narrow body; 155M parameters with the untied head."""
TARGET_MEMORY = 0.5
"""grpokit's peak memory against TRL's at 1,024 tokens."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=None, help="model dir or name (default: embedded SmolLM2)")
    ap.add_argument("--smoke", action="store_true", help="tiny model and a 2 x 2 grid")
    ap.add_argument("--generations", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument(
        "--lengths", type=int, nargs="+", help="default 64 128 256 (--memory: 256 1024)"
    )
    ap.add_argument("--setting", default="full-beta0.04", choices=list(SETTINGS))
    ap.add_argument("--steps", type=int, default=1, help="measured steps per point")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--memory", action="store_true", help="log-prob memory, not step time")
    ap.add_argument(
        "--vs-trl", action="store_true", help="grpokit against TRL, 128k vocabulary, G 8"
    )
    ap.add_argument("--vocab", type=int, default=LLAMA3_VOCAB, help="--memory: vocabulary size")
    ap.add_argument("--width", type=int, default=512, help="--vs-trl: the model's hidden size")
    ap.add_argument("--layers", type=int, default=8, help="--vs-trl: the model's layers")
    ap.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="--vs-trl: both sides recompute activations (TRL's default)",
    )
    ap.add_argument(
        "--lean-memory",
        action="store_true",
        help="--vs-trl: grpokit with logprob_chunk_size 256 and model.return_freed_memory",
    )
    ap.add_argument("--packing", action="store_true", help="padded against padding-free update")
    ap.add_argument("--rows", type=int, default=4, help="--memory: completions per micro-batch")
    ap.add_argument(
        "--chunk-sizes",
        type=int,
        nargs="+",
        default=[0, 256, 1024],
        help="--memory: 0 is unchunked",
    )
    ap.add_argument("--child-memory", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_memory:
        memory_child(args)
        return
    if args.memory:
        memory(args)
        return
    if args.vs_trl:
        against_trl(args)
        return
    if args.packing:
        packing(args)
        return
    args.lengths = args.lengths or [64, 128, 256]
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


def memory(args: argparse.Namespace) -> None:
    """Peak memory of the update's log-probs per (L, chunk size), each point in a fresh process."""
    import tempfile

    from grpokit.hub.embedded import embedded_model_dir
    from grpokit.models.tiny import make_tiny_model_dir

    if args.smoke:
        # logits of 8 MiB, so that the unchunked point's peak stands out of what the process
        # already holds (at 0.5 MiB it could stay within it: a ratio over 0)
        args.vocab, args.lengths, args.rows, args.chunk_sizes = 8192, [64], 4, [0, 16]
    args.lengths = args.lengths or [256, 1024]
    work = Path(tempfile.mkdtemp(prefix="grpokit-bench-vocab-"))
    path = make_tiny_model_dir(
        work, seed=0, tokenizer_dir=embedded_model_dir(), vocab_size=args.vocab
    )
    print(
        f"tiny model (2 layers, width 64), vocabulary {args.vocab:,}; {args.rows} completions "
        f"per micro-batch, float32, full fine-tuning; {load_average()}"
    )
    ratios = []
    for length in args.lengths:
        peaks: dict[int, float] = {}
        for chunk in args.chunk_sizes:
            r = run_child(
                Path(__file__).resolve(),
                [
                    "--child-memory",
                    f"--model-path={path}",
                    f"--vocab={args.vocab}",
                    f"--rows={args.rows}",
                    f"--lengths={length}",
                    f"--chunk-sizes={chunk}",
                    f"--threads={args.threads}",
                ],
            )
            peaks[chunk] = r["peak_mib"] - r["before_mib"]
            logits_mib = args.rows * length * args.vocab * 4 / 2**20
            print(
                f"L {length:5d}  chunk {chunk:5d}  forward+backward {r['seconds']:6.2f} s  "
                f"peak RSS {r['peak_mib']:8.0f} MiB, {peaks[chunk]:8.0f} MiB above the loaded "
                f"model (float32 logits of the micro-batch: {logits_mib:.0f} MiB; "
                f"{load_average()})",
                flush=True,
            )
        for chunk in args.chunk_sizes:
            if chunk and 0 in peaks:
                ratios.append(
                    (
                        f"L {length}: chunk {chunk} / all at once, memory above the model",
                        peaks[chunk] / peaks[0],
                        f"{peaks[chunk]:.0f} vs {peaks[0]:.0f} MiB",
                    )
                )
    print_ratios("log-prob memory ratios", ratios)


def against_trl(args: argparse.Namespace) -> None:
    """Seconds per step and peak memory, grpokit and TRL, per completion length."""
    from gpu_check import Shape, build_model

    from grpokit.hub.embedded import embedded_model_dir

    # A narrower body keeps the vocabulary's share of the work and costs less (a loaded machine).
    shape = {
        **VOCAB_SHAPE,
        "hidden_size": args.width,
        "intermediate_size": 3 * args.width,
        "num_hidden_layers": args.layers,
    }
    g = 8
    lengths = args.lengths or [256, 1024, 2048]
    if args.smoke:
        # a vocabulary beyond the tokenizer's 49,152, as the real run's
        shape, lengths, args.steps, g = {"vocab_size": 65_536}, [8], 1, 2
    root = Path(tempfile.mkdtemp(prefix="grpokit-bench-vocab-"))
    try:
        vocab = Shape("llama", {"tie_word_embeddings": False, **shape})  # untied, as before
        path = build_model("vocab", vocab, embedded_model_dir(), root, "cpu", "float32")
        _against_trl(args, path, lengths, g)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _against_trl(args: argparse.Namespace, path: Path, lengths: list[int], g: int) -> None:
    from safetensors import safe_open
    from transformers import AutoConfig

    vocab = int(AutoConfig.from_pretrained(path).vocab_size)
    parameters = 0
    for weights in path.glob("*.safetensors"):
        with safe_open(weights, "pt") as f:
            names = f.keys()
            parameters += sum(math.prod(f.get_slice(k).get_shape()) for k in names)
    recompute = ", gradient checkpointing" if args.gradient_checkpointing else ""
    recompute += "; grpokit with its lean-memory settings" if args.lean_memory else ""
    print(
        f"random-weight Llama, vocabulary {vocab:,}, {parameters / 1e6:.0f}M "
        f"parameters; 1 prompt x {g} completions of exactly L tokens (greedy, end tokens "
        f"suppressed); {args.setting}{recompute}; 1 warm-up + {args.steps} measured steps per point; "
        f"{args.threads or 'default'} thread(s); {load_average()}",
        flush=True,
    )
    script = Path(__file__).resolve().parent / "train_step.py"
    common = [
        f"--model-path={path}",
        f"--steps={args.steps}",
        "--prompts=1",
        f"--num-generations={g}",
        f"--threads={args.threads}",
        "--top-k=1",
        "--device=cpu",
        f"--setting={args.setting}",
    ] + (["--gradient-checkpointing"] if args.gradient_checkpointing else [])
    common += ["--lean-memory"] if args.lean_memory else []
    pairs: list[tuple[str, list[float], str]] = []
    rows: list[str] = []
    for length in lengths:
        results: dict[str, dict[str, Any]] = {}
        for peer in ("grpokit", "trl"):
            # TRL's steps at 2,048 tokens take over 15 minutes each on one thread
            r = run_child(
                script,
                [*common, f"--max-completion-length={length}", f"--child={peer}"],
                timeout=6 * 3600,
            )
            results[peer] = r
            print(
                f"L {length:5d}  {peer:<8} step {spread(r['step_times'])} s "
                f"(steps {', '.join(f'{t:.1f}' for t in r['step_times'])}), peak RSS "
                f"{r['rss_mib'] / 1024:.2f} GiB, mean completion {r['mean_length']:.0f} tokens "
                f"({load_average()})",
                flush=True,
            )
        ours, theirs = results["grpokit"], results["trl"]
        times = paired_ratios(ours["step_times"], theirs["step_times"])
        memory_ratio = ours["rss_mib"] / theirs["rss_mib"]
        pairs.append(
            (
                f"L {length}: grpokit / TRL seconds per step",
                times,
                verdict(median(times), TARGET_TIME, at_least=False),
            )
        )
        memory_note = (
            verdict(memory_ratio, TARGET_MEMORY, at_least=False) if length == 1024 else "peak RSS"
        )
        pairs.append((f"L {length}: grpokit / TRL peak memory", [memory_ratio], memory_note))
        rows.append(
            f"| {length:,} x {vocab:,} | {median(ours['step_times']):.1f} s | "
            f"{median(theirs['step_times']):.1f} s | {median(times):.2f}x "
            f"({min(times):.2f}-{max(times):.2f}) | {ours['rss_mib'] / 1024:.2f} GiB | "
            f"{theirs['rss_mib'] / 1024:.2f} GiB | {memory_ratio:.2f}x |"
        )
    print(
        "\n| L x vocabulary | grpokit s/step | TRL s/step | time ratio | grpokit peak | "
        "TRL peak | memory ratio |\n|---|---|---|---|---|---|---|"
    )
    print("\n".join(rows))
    print_paired("grpokit against TRL by completion length", pairs)


PACKING_LAYOUTS = {
    "padded": {"share_prompts": True},
    "padded-plain": {"share_prompts": False},
    "packed": {"padding_free": True},
}
"""--packing's layouts: completion_logprobs' keyword arguments."""


def packing(args: argparse.Namespace) -> None:
    """Seconds of one micro-batch's forward and backward, padded and packed, interleaved."""
    import time

    import torch

    from grpokit.models.loading import load_policy
    from grpokit.train.forward import completion_logprobs, pack

    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = args.lengths or [128, 512]
    rows = 8
    if args.smoke:
        lengths, args.steps = [16], 1
    args.model_path = model_path(args.smoke, args.model)
    policy = load_policy(args.model_path, need_reference=False)
    model = policy.model
    model.train()
    prompt = chat_prompts(policy.tokenizer, 1)[0]
    vocab = int(model.get_input_embeddings().num_embeddings)
    print(
        f"model {args.model_path}; {rows} completions of one {len(prompt)}-token prompt, lengths "
        f"L/8 .. L; forward + backward of the log-probs, full fine-tuning; {load_average()}"
    )
    gen = torch.Generator().manual_seed(0)
    pairs: list[tuple[str, list[float], str]] = []
    for length in lengths:
        sizes = torch.linspace(max(1, length // 8), length, rows).round().long().tolist()
        completions = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in sizes]
        batch = pack([prompt] * rows, completions, pad_token_id=policy.pad_token_id)
        seconds: dict[str, list[float]] = {name: [] for name in PACKING_LAYOUTS}
        for repeat in range(args.steps + 1):  # the first round warms up
            for name, layout in PACKING_LAYOUTS.items():
                model.zero_grad(set_to_none=True)
                t0 = time.perf_counter()
                logp, _ = completion_logprobs(model, batch, with_entropy=True, **layout)
                (logp * batch.completion_mask).sum().backward()
                if repeat:
                    seconds[name].append(time.perf_counter() - t0)
        real = sum(len(prompt) + n for n in sizes)
        print(
            f"L {length:5d}  "
            + "  ".join(f"{name} {spread(t)} s" for name, t in seconds.items())
            + f"  (tokens: packed {real}, padded {rows * (len(prompt) + length)}; "
            f"{load_average()})",
            flush=True,
        )
        for name in ("padded", "padded-plain"):
            pairs.append(
                (
                    f"L {length}: packed / {name} seconds",
                    paired_ratios(seconds["packed"], seconds[name]),
                    "forward + backward",
                )
            )
    print_paired("padding-free against padded", pairs)


def memory_child(args: argparse.Namespace) -> None:
    """One point: the forward and backward of one micro-batch's log-probs, in this process."""
    import time

    import torch

    from grpokit.models.loading import load_policy
    from grpokit.train.forward import completion_logprobs, pack

    if args.threads:
        torch.set_num_threads(args.threads)
    (length,), (chunk,) = args.lengths, args.chunk_sizes
    model = load_policy(args.model_path, need_reference=False).model
    model.train()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, args.vocab, (PROMPT_TOKENS,), generator=gen).tolist()
    completions = [
        torch.randint(3, args.vocab, (length,), generator=gen).tolist() for _ in range(args.rows)
    ]
    batch = pack([prompt] * args.rows, completions, pad_token_id=2)
    before = reset_peak_rss_mib()
    t0 = time.perf_counter()
    logp, _ = completion_logprobs(
        model, batch, temperature=0.7, with_entropy=True, logprob_chunk_size=chunk
    )
    (logp * batch.completion_mask).sum().backward()
    seconds = time.perf_counter() - t0
    emit_result({"before_mib": before, "peak_mib": peak_rss_since_reset_mib(), "seconds": seconds})


if __name__ == "__main__":
    main()
