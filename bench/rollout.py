"""Rollout speed: grpokit's torch engine against transformers' ``generate`` and the decode floor.

Same model, prompts, sampling settings (temperature 1, no top-k / top-p) and batch sizes; a batch
of B completions is B / G prompts with G completions each, as in a GRPO step. Tokens counted are
real completion tokens (up to and including EOS; ``generate``'s padding after EOS is not counted).
The decode floor is a bare batched forward per token with a KV cache (no sampling, no stopping),
at the full batch for the same number of steps: what the hardware does per token at that batch.

grpokit's engine runs as ``model.dtype: auto`` makes it run: on a CPU with native bfloat16
(AVX512-BF16 or AMX) it decodes with a bfloat16 copy of the weights ("grpokit"); "grpokit-fp32"
is the same engine in float32, and their ratio is bfloat16's gain. It computes linear layers
through oneDNN on CPU (grpokit.models.onednn), which on some CPUs is much faster than PyTorch's
default MKL path, or, decoding float32 on a CPU with AVX2 and no AVX-512, through grpokit's own
blocked product (grpokit.native.fused.BlockedLinear); there "grpokit-onednn" is the same engine
with oneDNN's prepacked products (``cpu_matmul: onednn``), and the ratio is the blocked product's
gain. So that the engine's own gain and the library's can be told apart, ``generate``
and the floor are also run on a copy of the model whose linear layers use oneDNN
("generate-onednn", "floor-onednn"); the target is against the stock ``generate``, the one a
transformers or TRL user gets.

vLLM, where it is installed (a CUDA build, or the CPU build: ``scripts/setup.sh vllm``, then run
this with ``.venv-vllm/bin/python``), is a peer: its engine colocated as ``use_vllm: true`` runs
it, in the dtype grpokit computes in ("vllm") and in float32 ("vllm-fp32"), on the same prompts
and settings (vLLM draws its own random numbers); where grpokit computes in float32 (no native
bfloat16), vLLM also runs in bfloat16 ("vllm-bf16"), a choice its users have there.
``--no-vllm`` leaves it out.

Every repeat runs every method once on the same prompts and seed, one after the other; a ratio is
the median of the repeats' paired ratios (repeat k against repeat k), printed with its spread.

    python bench/rollout.py                      # embedded SmolLM2-135M, batches 8 and 32
    python bench/rollout.py --smoke              # tiny random model, seconds (used by the tests)
    python bench/rollout.py --batch-sizes 8 32 64 --max-new-tokens 128 --repeats 8
    .venv-vllm/bin/python bench/rollout.py       # with vLLM's CPU build as a peer

Prints per-run lines, then the ratios last.
"""

from __future__ import annotations

import argparse
import copy
import sys
from functools import partial
from pathlib import Path
from typing import Any

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
    timed,
    verdict,
)

from grpokit.errors import UserError  # noqa: E402
from grpokit.models.onednn import (  # noqa: E402
    bf16_compute_applies,
    use_onednn_linears,
)
from grpokit.native.heuristics import blocked_products_pay  # noqa: E402
from grpokit.rollout.base import RolloutEngine, SamplingParams  # noqa: E402
from grpokit.rollout.torch_engine import TorchEngine, left_pad  # noqa: E402
from grpokit.rollout.vllm_engine import VLLMEngine, vllm_available  # noqa: E402

TARGET_VS_GENERATE = 1.8
TARGET_BF16 = 1.6


def hf_generate(
    model: Any,
    prompts: list[list[int]],
    g: int,
    max_new: int,
    eos: list[int],
    pad: int,
    seed: int,
    fixed: bool = False,
) -> int:
    """Completion tokens sampled by ``generate`` (G per prompt, up to and including EOS; all
    ``max_new`` with ``fixed``)."""
    ids, mask, _ = left_pad(prompts, pad, torch.device("cpu"))
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new,
            min_new_tokens=max_new if fixed else 0,
            num_return_sequences=g,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    completions = out[:, ids.shape[1] :]
    is_eos = torch.isin(completions, torch.tensor(eos))
    # Length = position of the first EOS + 1, or the whole row when there is none.
    first = torch.where(is_eos.any(-1), is_eos.float().argmax(-1) + 1, completions.shape[1])
    return int(first.sum())


def engine_generate(
    engine: RolloutEngine,
    prompts: list[list[int]],
    g: int,
    max_new: int,
    seed: int,
    fixed: bool = False,
) -> int:
    params = SamplingParams(max_completion_length=max_new, temperature=1.0, ignore_eos=fixed)
    batch = engine.generate(prompts, g, params, generator=torch.Generator().manual_seed(seed))
    return sum(batch.completion_lengths)


def decode_floor(model: Any, prompts: list[list[int]], g: int, steps: int, pad: int) -> int:
    """B x steps tokens of bare cached decoding: prefill the B rows, then one forward per token."""
    from transformers import DynamicCache

    ids, mask, pos = left_pad(prompts, pad, torch.device("cpu"))
    ids, mask, pos = (t.repeat_interleave(g, dim=0) for t in (ids, mask, pos))
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        nxt = pos[:, -1:] + 1
        for _ in range(steps - 1):
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
            out = model(
                input_ids=token,
                attention_mask=mask,
                position_ids=nxt,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            nxt = nxt + 1
    return ids.shape[0] * steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=None, help="model dir or name (default: embedded SmolLM2)")
    ap.add_argument("--smoke", action="store_true", help="tiny random model, 1 repeat, 8 tokens")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--num-generations", type=int, default=4, help="completions per prompt (G)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=MIN_MEASURED, help="measured repeats")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--no-vllm", action="store_true", help="leave vLLM out even where installed")
    ap.add_argument(
        "--fixed-length",
        action="store_true",
        help="every completion runs to --max-new-tokens (EOS ignored), so engines are compared "
        "on the same work instead of on where their samples happened to end",
    )
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="METHOD",
        help="run only these besides grpokit, which always runs (grpokit-fp32, grpokit-eager, "
        "grpokit-onednn, generate, floor, generate-onednn, floor-onednn, vllm, vllm-fp32, "
        "vllm-bf16); the ratios that need the others are left out",
    )
    args = ap.parse_args()
    if args.smoke:
        args.repeats, args.max_new_tokens = 1, 8
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_path(args.smoke, args.model, **VLLM_TINY_SHAPE)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    eos = [int(tokenizer.eos_token_id)]
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0])
    # What model.dtype: auto computes in here (grpokit.models.loading.load_policy).
    bf16 = bf16_compute_applies(torch.device("cpu"))
    auto = torch.bfloat16 if bf16 else torch.float32
    engine = TorchEngine(model, eos_token_ids=eos, pad_token_id=pad, compute_dtype=auto)
    engine32 = TorchEngine(model, eos_token_ids=eos, pad_token_id=pad, compute_dtype=torch.float32)
    eager = TorchEngine(
        model, eos_token_ids=eos, pad_token_id=pad, compute_dtype=auto, fused_kernels=False
    )
    # Where the engine decodes with its blocked float32 product, the same with oneDNN's.
    blocked = not bf16 and blocked_products_pay()
    engine_onednn = TorchEngine(
        model, eos_token_ids=eos, pad_token_id=pad, compute_dtype=auto, cpu_matmul="onednn"
    )
    onednn_model = copy.deepcopy(model)
    use_onednn_linears(onednn_model, "onednn")
    g = args.num_generations
    print(
        f"model {path}; G = {g}; max_new_tokens {args.max_new_tokens}"
        f"{' (fixed: EOS ignored)' if args.fixed_length else ''}; grpokit decodes in "
        f"{str(auto).removeprefix('torch.')}; {args.repeats} measured repeats; "
        f"{torch.get_num_threads()} threads; {load_average()}"
    )
    peers: dict[str, VLLMEngine] = {}
    if not args.no_vllm and vllm_available():
        longest = max(len(p) for p in chat_prompts(tokenizer, max(args.batch_sizes) // g))
        # Without native bfloat16 grpokit decodes in float32; vLLM's CPU build still runs
        # bfloat16 there (its own kernels convert), which its users may pick: "vllm-bf16".
        dtypes = (
            {"vllm": auto, "vllm-fp32": torch.float32}
            if bf16
            else {"vllm": auto, "vllm-bf16": torch.bfloat16}
        )
        for name, dtype in dtypes.items():
            try:
                seconds, peers[name] = timed(
                    partial(
                        VLLMEngine,
                        model,
                        model_path=str(path),
                        eos_token_ids=eos,
                        gpu_memory_utilization=0.1,
                        max_model_len=longest + args.max_new_tokens,
                        max_num_seqs=max(args.batch_sizes),
                        dtype=dtype,
                    )
                )
            except UserError as e:  # a model vLLM cannot run here
                print(f"vLLM: not compared ({e})")
                break
            print(f"{name}: engine built in {seconds:.1f} s")
    else:
        print("vLLM: not compared (--no-vllm, or not installed here)")

    # One untimed pass of each so lazy initialisation is not measured.
    warm = chat_prompts(tokenizer, 1)
    for warm_engine in (engine, engine32, eager, engine_onednn, *peers.values()):
        engine_generate(warm_engine, warm, 2, 4, 0)
    hf_generate(model, warm, 2, 4, eos, pad, 0)

    pairs: list[tuple[str, list[float], str]] = []
    for batch in args.batch_sizes:
        if batch % g:
            raise SystemExit(f"batch size {batch} is not a multiple of G = {g}")
        prompts = chat_prompts(tokenizer, batch // g)
        rates: dict[str, list[float]] = {}
        for rep in range(args.repeats):  # interleaved: a load spike hits every method alike
            seed = 1000 * batch + rep
            n_new, fixed = args.max_new_tokens, args.fixed_length
            runs = {
                "grpokit": partial(engine_generate, engine, prompts, g, n_new, seed, fixed),
                "grpokit-fp32": partial(engine_generate, engine32, prompts, g, n_new, seed, fixed),
                "grpokit-eager": partial(engine_generate, eager, prompts, g, n_new, seed, fixed),
                "grpokit-onednn": partial(
                    engine_generate, engine_onednn, prompts, g, n_new, seed, fixed
                ),
                "generate": partial(hf_generate, model, prompts, g, n_new, eos, pad, seed, fixed),
                "floor": partial(decode_floor, model, prompts, g, n_new, pad),
                "generate-onednn": partial(
                    hf_generate, onednn_model, prompts, g, n_new, eos, pad, seed, fixed
                ),
                "floor-onednn": partial(decode_floor, onednn_model, prompts, g, n_new, pad),
            }
            if not bf16:  # the two grpokit runs would be the same
                del runs["grpokit-fp32"]
            if not blocked:  # the same again
                del runs["grpokit-onednn"]
            for name, peer in peers.items():
                runs[name] = partial(engine_generate, peer, prompts, g, n_new, seed, fixed)
            if args.only:
                runs = {k: v for k, v in runs.items() if k in args.only or k == "grpokit"}
            for name, fn in runs.items():
                seconds, tokens = timed(fn)
                rates.setdefault(name, []).append(tokens / seconds)
                print(
                    f"batch {batch:3d} rep {rep} {name:<15} {tokens:6d} tokens "
                    f"{seconds:7.2f} s {tokens / seconds:8.1f} tok/s ({load_average()})",
                    flush=True,
                )
        print(
            f"batch {batch:3d} median tok/s: "
            + ", ".join(f"{k} {median(v):.1f}" for k, v in rates.items())
        )
        ours = rates["grpokit"]

        # (peer, label, what the ratio means or its target); a peer left out by --only is skipped.
        against: list[tuple[str, str, str | float]] = [
            ("generate", "grpokit / generate tokens per second", TARGET_VS_GENERATE),
            ("grpokit-fp32", "grpokit bfloat16 / float32 tokens per second", TARGET_BF16),
            (
                "grpokit-eager",
                "grpokit / its eager step",
                "the fused decode kernels' gain (the same engine with them off)",
            ),
            (
                "grpokit-onednn",
                "grpokit / grpokit-onednn",
                "the blocked float32 product's gain over oneDNN's prepacked one",
            ),
            (
                "generate-onednn",
                "grpokit / generate-onednn",
                "the engine's gain over generate on the same oneDNN linears",
            ),
            (
                "floor",
                "grpokit / decode floor (torch default)",
                "1.0 = a bare float32 cached forward per token at this batch",
            ),
            (
                "floor-onednn",
                "grpokit / decode floor (oneDNN linears)",
                "the same floor with oneDNN linear layers",
            ),
        ]
        for other, label, note in against:
            if other not in rates:
                continue
            ratios = paired_ratios(ours, rates[other])
            if not isinstance(note, str):
                note = verdict(median(ratios), note, at_least=True)
            pairs.append((f"batch {batch}: {label}", ratios, note))
        for ours_name, peer_name, note in (
            ("grpokit", "vllm", "the same dtype; above 1.0 grpokit's engine is the faster"),
            ("grpokit-fp32", "vllm-fp32", "the same dtype; above 1.0 grpokit's is the faster"),
            ("grpokit", "vllm-bf16", "grpokit in float32 against vLLM in bfloat16"),
        ):
            if peer_name in rates and ours_name in rates:
                pairs.append(
                    (
                        f"batch {batch}: {ours_name} / {peer_name} tokens per second",
                        paired_ratios(rates[ours_name], rates[peer_name]),
                        note,
                    )
                )
    print_paired("rollout ratios", pairs)


if __name__ == "__main__":
    main()
