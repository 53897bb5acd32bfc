"""vLLM colocated on one CUDA GPU, offline: rollout throughput, weight-sync seconds and GPU memory,
with sleep mode, LoRA synced merged and as the adapter alone, on random-initialised Llama-shaped
models of 1.5B and 8B parameters.

Run it through ``bench/gpu_check.sh --vllm`` (needs vLLM's CUDA build in the interpreter; the
wheels folder does not carry it, as it pins its own CUDA torch). Nothing is downloaded:

- each model is a directory with a config and the embedded SmolLM2 tokenizer, no weights: vLLM
  starts from random weights (``load_format: dummy``) and the policy is initialised in place on
  the GPU in bfloat16; the first sync then gives vLLM the policy's weights, as a run does;
- per model and ``training.vllm_lora_sync`` value (merged, adapter) one child process (its GPU
  memory its own) builds the LoRA policy (r 16, all linear layers) and a colocated engine with
  sleep mode (vLLM sleeps between generations, weights offloaded, KV cache freed), then repeats:
  move the adapter as an optimizer step would, sync (seconds), generate ``--prompts`` x G
  completions of up to ``--max-new-tokens`` (tokens per second, wake-up included);
- prints per run the engine's start, the first sync (all weights), the median sync and tokens
  per second with their spread, and the GPU memory in use (device-wide, the policy included)
  with vLLM awake and asleep; then the ratios adapter / merged.

    bench/gpu_check.sh --vllm               # on the GPU machine (estimated: 8 minutes)
    bench/gpu_check.sh --vllm --cpu-smoke   # tiny model on vLLM's CPU build, no sleep mode: the
                                            # same code path, measuring nothing
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    VLLM_TINY_SHAPE,
    chat_prompts,
    emit_result,
    load_average,
    paired_ratios,
    peak_rss_mib,
    print_paired,
    run_child,
    spread,
)

SHAPES: dict[str, dict[str, Any]] = {
    # Qwen2.5-1.5B's layers in Llama's architecture; with SmolLM2's 49k vocabulary, untied: 1.46B.
    "llama-1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    },
    # Llama-3-8B's layers; with SmolLM2's 49k vocabulary (not 128k), untied: 7.4B.
    "llama-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    },
}
SMOKE_SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2} | VLLM_TINY_SHAPE
}
SYNCS = ("merged", "adapter")
LORA = {"r": 16, "lora_alpha": 32}


def model_dir(name: str, shape: dict[str, Any], root: Path) -> Path:
    """A model directory without weights: the Llama config of ``shape`` and the embedded
    tokenizer (vLLM loads random weights; the policy is initialised from the config)."""
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig

    from grpokit.hub.embedded import embedded_model_dir
    from grpokit.hub.resolve import pad_token_id

    out = root / name
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad_token_id(tokenizer),
        **shape,
    )
    config.save_pretrained(out)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def used_memory_gib(device: Any) -> float:
    """Memory in use: on a GPU the whole device's (vLLM's allocations are not torch's), on CPU
    this process's peak resident memory."""
    import torch

    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return float(total - free) / 2**30
    return peak_rss_mib() / 1024


def nudge_adapter(model: Any, step: int) -> None:
    """Move every LoRA factor a little, as an optimizer step does (lora_B starts at zero)."""
    import torch

    generator = torch.Generator().manual_seed(step)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn(p.shape, generator=generator).to(p) * 0.01)


def child(args: argparse.Namespace) -> None:
    """One engine: ``args.run`` is MODEL_DIR=SYNC; prints its measurements."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from grpokit.rollout.base import SamplingParams
    from grpokit.rollout.vllm_engine import VLLMEngine

    path, sync = args.run.rsplit("=", 1)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(path)
    t0 = time.perf_counter()
    with device:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)
    model = get_peft_model(model, LoraConfig(target_modules="all-linear", **LORA)).eval()
    policy_s = time.perf_counter() - t0
    parameters = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    prompts = chat_prompts(tokenizer, args.prompts)
    g = args.num_generations
    t0 = time.perf_counter()
    engine = VLLMEngine(
        model,
        model_path=path,
        eos_token_ids=[int(tokenizer.eos_token_id)],
        gpu_memory_utilization=args.memory_share,
        max_model_len=max(len(p) for p in prompts) + args.max_new_tokens,
        max_num_seqs=args.prompts * g,
        dtype=dtype,
        lora_sync=sync,  # type: ignore[arg-type]
        sleep_mode=device.type == "cuda",
        load_format="dummy",
    )
    build_s = time.perf_counter() - t0
    awake_gib = used_memory_gib(device)
    first_sync_s = _timed(engine.sync_weights)  # every weight: vLLM started from random ones
    params = SamplingParams(max_completion_length=args.max_new_tokens, temperature=1.0)
    engine.generate(prompts[:1], 2, SamplingParams(max_completion_length=4))  # warm-up
    asleep_gib = used_memory_gib(device)
    syncs, rates = [], []
    for rep in range(args.repeats):
        nudge_adapter(model, rep)
        syncs.append(_timed(engine.sync_weights))
        t0 = time.perf_counter()
        batch = engine.generate(prompts, g, params)
        rates.append(sum(batch.completion_lengths) / (time.perf_counter() - t0))
    emit_result(
        {
            "parameters": parameters,
            "policy_s": policy_s,
            "build_s": build_s,
            "first_sync_s": first_sync_s,
            "sync_s": syncs,
            "tokens_per_s": rates,
            "awake_gib": awake_gib,
            "asleep_gib": asleep_gib,
            "sleep_mode": engine.sleep_mode,
        }
    )


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def report(model: str, sync: str, r: dict[str, Any]) -> None:
    memory = "GPU in use" if r["sleep_mode"] else "peak RSS (no sleep mode on CPU)"
    print(
        f"{model:<11} {sync:<8} {r['parameters'] / 1e9:5.2f}B  policy {r['policy_s']:5.1f} s, "
        f"engine {r['build_s']:5.1f} s, first sync {r['first_sync_s']:6.2f} s; sync "
        f"{spread(r['sync_s'])} s; {spread(r['tokens_per_s'], 0)} tokens/s; {memory}: awake "
        f"{r['awake_gib']:.1f} GiB, asleep {r['asleep_gib']:.1f} GiB",
        flush=True,
    )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny model on vLLM's CPU build")
    ap.add_argument("--models", nargs="+", help=f"shapes to run (default {', '.join(SHAPES)})")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per generation")
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3, help="sync + generation repeats")
    ap.add_argument("--memory-share", type=float, default=0.3, help="vllm_gpu_memory_utilization")
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    if args.run:
        child(args)
        return
    started = time.perf_counter()
    import torch

    from grpokit.rollout.vllm_engine import vllm_available

    if not vllm_available():
        sys.exit(
            "vLLM is not usable here: on the GPU machine install vLLM's CUDA build (pip install "
            "'grpokit[vllm]', where PyPI is reachable); on CPU use .venv-vllm (docs/vllm.md)"
        )
    if args.cpu_smoke:
        shapes = {n: SMOKE_SHAPES[n] for n in args.models or SMOKE_SHAPES}
        args.device, args.bf16 = "cpu", False
        args.prompts, args.num_generations, args.max_new_tokens, args.repeats = 1, 2, 4, 1
        args.memory_share = 0.05
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device here; bench/gpu_check.sh --vllm --cpu-smoke runs it on CPU")
        shapes = {n: SHAPES[n] for n in args.models or SHAPES}
        args.device, args.bf16 = "cuda", True
    work = Path(tempfile.mkdtemp(prefix="grpokit-gpu-vllm-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(
        f"vLLM colocated on {device}; {'bfloat16' if args.bf16 else 'float32'}; LoRA r "
        f"{LORA['r']} all linear layers; {args.prompts} prompts x {args.num_generations} "
        f"completions of up to {args.max_new_tokens} tokens; {args.repeats} repeats; "
        f"{load_average()}",
        flush=True,
    )
    common = [
        f"--prompts={args.prompts}",
        f"--num-generations={args.num_generations}",
        f"--max-new-tokens={args.max_new_tokens}",
        f"--repeats={args.repeats}",
        f"--memory-share={args.memory_share}",
        f"--device={args.device}",
    ] + (["--bf16"] if args.bf16 else [])
    results: dict[tuple[str, str], dict[str, Any]] = {}
    for name, shape in shapes.items():
        path = model_dir(name, shape, work)
        for sync in SYNCS:
            out = run_child(Path(__file__).resolve(), [*common, f"--run={path}={sync}"], 540)
            results[(name, sync)] = out
            report(name, sync, out)
    pairs = []
    for name in shapes:
        merged, adapter = results[(name, "merged")], results[(name, "adapter")]
        pairs += [
            (
                f"{name}: merged / adapter seconds per sync",
                paired_ratios(merged["sync_s"], adapter["sync_s"]),
                "above 1.0 the adapter syncs faster",
            ),
            (
                f"{name}: adapter / merged tokens per second",
                paired_ratios(adapter["tokens_per_s"], merged["tokens_per_s"]),
                "below 1.0 vLLM's LoRA kernels cost generation speed",
            ),
        ]
    print_paired("vLLM: LoRA adapter sync against merged", pairs)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
