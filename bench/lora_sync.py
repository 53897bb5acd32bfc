"""vLLM under LoRA: the adapter-only sync against the merged dense sync.

One LoRA policy (all linear layers, r 16) and two colocated vLLM engines on the same model, one
per ``training.vllm_lora_sync`` value. Every repeat changes the adapter as an optimizer step
would (every LoRA factor moved a little), then syncs each engine (seconds per sync) and samples
the same prompts with each (completion tokens per second; with the adapter, vLLM's LoRA kernels
run beside the base weights at every token). Ratios are merged / adapter for the sync time
and adapter / merged for tokens per second, paired repeat by repeat; load from ``uptime``.

Needs vLLM (``.venv-vllm/bin/python bench/lora_sync.py`` on CPU, see docs/vllm.md).

    .venv-vllm/bin/python bench/lora_sync.py                  # embedded SmolLM2-135M
    .venv-vllm/bin/python bench/lora_sync.py --smoke          # tiny random model, seconds
    .venv-vllm/bin/python bench/lora_sync.py --repeats 8 --batch 32 --dtype float32
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    MIN_MEASURED,
    VLLM_TINY_SHAPE,
    chat_prompts,
    load_average,
    median,
    model_path,
    paired_ratios,
    print_paired,
    spread,
    timed,
)

from grpokit.models.loading import LoraSettings, load_policy  # noqa: E402
from grpokit.models.onednn import bf16_compute_applies  # noqa: E402
from grpokit.rollout.base import SamplingParams  # noqa: E402
from grpokit.rollout.vllm_engine import VLLMEngine, vllm_available  # noqa: E402

SYNCS = ("merged", "adapter")


def nudge_adapter(model: torch.nn.Module, step: int) -> None:
    """Move every LoRA factor a little, as an optimizer step does (lora_B starts at zero)."""
    generator = torch.Generator().manual_seed(step)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn(p.shape, generator=generator).to(p) * 0.01)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=None, help="model dir or name (default: embedded SmolLM2)")
    ap.add_argument("--smoke", action="store_true", help="tiny random model, 1 repeat, 8 tokens")
    ap.add_argument("--batch", type=int, default=32, help="completions per repeat (prompts x G)")
    ap.add_argument("--num-generations", type=int, default=4, help="completions per prompt (G)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    ap.add_argument("--repeats", type=int, default=MIN_MEASURED, help="measured repeats")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.smoke:
        args.repeats, args.max_new_tokens, args.batch = 1, 8, 8
    if not vllm_available():
        sys.exit("vLLM is not installed here: run this with .venv-vllm/bin/python (docs/vllm.md)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype
    if dtype == "auto":  # what model.dtype: auto computes in
        dtype = "bfloat16" if device.type == "cuda" or bf16_compute_applies(device) else "float32"
    path = model_path(args.smoke, args.model, **VLLM_TINY_SHAPE)
    policy = load_policy(
        path,
        dtype="float32",  # trained in float32, as on CPU; vLLM computes in `dtype`
        lora=LoraSettings(r=args.rank, alpha=2 * args.rank),
        need_reference=False,
        device=device,
    )
    g = args.num_generations
    prompts = chat_prompts(policy.tokenizer, args.batch // g)
    longest = max(len(p) for p in prompts)
    engines: dict[str, VLLMEngine] = {}
    for sync in SYNCS:
        seconds, engines[sync] = timed(
            partial(
                VLLMEngine,
                policy.model,
                model_path=path,
                eos_token_ids=policy.eos_token_ids(),
                gpu_memory_utilization=0.1,
                max_model_len=longest + args.max_new_tokens,
                max_num_seqs=args.batch,
                dtype=getattr(torch, dtype),
                lora_sync=sync,  # type: ignore[arg-type]
            )
        )
        print(f"{sync}: engine built in {seconds:.1f} s", flush=True)
    print(
        f"model {path}; LoRA r {args.rank}; vLLM in {dtype}; batch {args.batch} (G = {g}); "
        f"{args.max_new_tokens} new tokens; {args.repeats} measured repeats; {load_average()}"
    )
    params = SamplingParams(max_completion_length=args.max_new_tokens, temperature=1.0)
    sync_s: dict[str, list[float]] = {s: [] for s in SYNCS}
    rate: dict[str, list[float]] = {s: [] for s in SYNCS}
    for rep in range(-1, args.repeats):  # repeat -1 warms up (the adapter's first load)
        nudge_adapter(policy.model, rep + 1)
        for sync, engine in engines.items():
            seconds, _ = timed(engine.sync_weights)
            gen_s, batch = timed(partial(engine.generate, prompts, g, params))
            tokens = sum(batch.completion_lengths)
            print(
                f"rep {rep:2d} {sync:<8} sync {seconds:6.2f} s  {tokens:5d} tokens in "
                f"{gen_s:6.2f} s {tokens / gen_s:8.1f} tok/s ({load_average()})",
                flush=True,
            )
            if rep >= 0:
                sync_s[sync].append(seconds)
                rate[sync].append(tokens / gen_s)
    for sync in SYNCS:
        print(
            f"{sync:<8} sync seconds {spread(sync_s[sync])}; tokens/s {spread(rate[sync], 1)}; "
            f"medians {median(sync_s[sync]):.2f} s, {median(rate[sync]):.1f} tok/s"
        )
    print_paired(
        "LoRA sync: adapter against merged",
        [
            (
                "merged / adapter seconds per sync",
                paired_ratios(sync_s["merged"], sync_s["adapter"]),
                "above 1.0 the adapter syncs faster",
            ),
            (
                "adapter / merged rollout tokens per second",
                paired_ratios(rate["adapter"], rate["merged"]),
                "below 1.0 the LoRA kernels cost generation speed",
            ),
        ],
    )


if __name__ == "__main__":
    main()
