"""Does the exported model answer as the checkpoint did? Greedy completions of a few held-out
prompts from both, compared token for token.

``grpokit export`` runs this after writing the file: the checkpoint's greedy answers (PyTorch,
the weights as trained) against the export's in the runtime that serves it, transformers for an
HF directory and llama.cpp for a GGUF. Each side encodes the prompt as its runtime does (the
exported chat template and BOS), so a template or BOS that did not travel shows as different
prompt tokens, and a quantisation that changes the answers shows as different completions. The
result is printed as "k of n identical" and stored beside the export.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from grpokit.data.chat import encode_prompt, render_prompt
from grpokit.data.prompts import Prompt
from grpokit.errors import UserError
from grpokit.files import write_json
from grpokit.models.export import LoadedCheckpoint

FALLBACK_PROMPTS: tuple[str, ...] = (
    "What is 17 + 25?",
    "Write one sentence about rivers.",
    "Name three colours.",
    "Explain what a prime number is in one sentence.",
)
"""Prompts for a checkpoint without a run config to take held-out prompts from."""

SAFER_TYPES: dict[str, str] = {"q4_k_m": "q6_k", "q5_k_m": "q6_k", "q6_k": "q8_0", "q8_0": "f16"}
"""The next type up in precision, named when a quantisation changes what the checkpoint does."""


@dataclass
class Answer:
    """One prompt's greedy completion from the checkpoint and from the export."""

    prompt: str
    checkpoint: str
    export: str
    same_prompt_tokens: bool
    same_completion: bool


@dataclass
class Fidelity:
    """The comparison, as stored beside the export (``<file>.fidelity.json`` for a GGUF,
    ``grpokit_fidelity.json`` inside an HF directory)."""

    export: str
    runtime: str
    outtype: str
    max_new_tokens: int
    identical: int
    n: int
    answers: list[Answer]
    format_rate: dict[str, float] = field(default_factory=dict)
    """Share of completions in the run's xml_format, ``checkpoint`` and ``export`` (where the run
    has that reward)."""
    warning: str | None = None

    @property
    def summary(self) -> str:
        tokens = sum(a.same_prompt_tokens for a in self.answers)
        line = (
            f"fidelity: {self.identical} of {self.n} greedy completions identical to the "
            f"checkpoint's ({self.runtime}, {self.outtype}, {self.max_new_tokens} new tokens); "
            f"prompt tokens identical in {tokens} of {self.n}"
        )
        if self.format_rate:
            line += (
                f"; format kept in {self.format_rate['export']:.0%} "
                f"(checkpoint {self.format_rate['checkpoint']:.0%})"
            )
        return line


def _greedy_torch(model: Any, ids: list[int], eos: set[int], max_new_tokens: int) -> list[int]:
    """The greedy continuation of ``ids`` up to an end token, the end token left out."""
    from transformers import GenerationConfig

    # A config of its own: the model's may hold sampling settings that greedy decoding ignores
    # with a warning each call.
    config = GenerationConfig(  # type: ignore[no-untyped-call]
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=sorted(eos),
        pad_token_id=min(eos),
    )
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), generation_config=config)
    completion = [int(t) for t in out[0, len(ids) :]]
    return completion[: next((i for i, t in enumerate(completion) if t in eos), len(completion))]


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update([extra] if isinstance(extra, int) else list(extra or []))
    return ids


def _llama_cpp_side(
    path: Path, texts: Sequence[str], max_new_tokens: int, context: int
) -> list[tuple[list[int], list[int]]]:
    """(prompt tokens, greedy completion) of each rendered prompt as llama.cpp's server has them:
    its own tokenizer, its BOS rule, a leading BOS the template wrote taken as that BOS."""
    from grpokit.models.gguf_runtime import GGUFModel, require_cyllama

    try:
        require_cyllama("the fidelity check of a GGUF export")
    except UserError as exc:
        raise UserError(f"{exc}, or pass --check 0") from exc
    with GGUFModel(path, n_ctx=context, n_threads=max(1, torch.get_num_threads())) as llm:
        bos_text = llm.token_text(llm.token_bos)
        out = []
        for text in texts:
            if llm.adds_bos and text.startswith(bos_text):
                text = text[len(bos_text) :]
            prompt = llm.tokenize(text, add_bos=True, special=True)
            out.append((prompt, llm.greedy(prompt, max_new_tokens, stop_at_end=True)))
        return out


def check_export(
    loaded: LoadedCheckpoint,
    exported: Path,
    *,
    fmt: str,
    outtype: str,
    prompts: Sequence[Prompt],
    system_prompt: str | None = None,
    format_tags: list[str] | None = None,
    max_new_tokens: int = 48,
    log: Callable[[str], None] = print,
) -> Fidelity:
    """Compare the checkpoint's greedy completions of ``prompts`` with the export's, store the
    result beside the export and return it (a warning, if any, goes to ``log``).

    Args:
        loaded: the checkpoint as loaded for the export (the merged float32 model).
        exported: the HF directory or GGUF file written.
        fmt, outtype: what was written (``hf`` with its dtype name, or the GGUF type).
        prompts: held-out prompts (a few; each costs two greedy decodes).
        system_prompt: the run's system prompt, rendered as training rendered it.
        format_tags: the run's xml_format tags, to say whether the export keeps the format.
        max_new_tokens: completion length compared.
    """
    from grpokit.rewards.builtin.format import xml_format_score

    tok, model = loaded.tokenizer, loaded.model
    eos = _eos_ids(model, tok)
    ours = [encode_prompt(tok, p, system_prompt=system_prompt) for p in prompts]
    mine = [_greedy_torch(model, ids, eos, max_new_tokens) for ids in ours]
    if fmt == "gguf":
        texts = [render_prompt(tok, p, system_prompt=system_prompt) for p in prompts]
        context = max(len(ids) for ids in ours) + max_new_tokens + 8
        theirs = _llama_cpp_side(exported, texts, max_new_tokens, context)
        runtime = "llama.cpp"
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        their_tok = AutoTokenizer.from_pretrained(exported)
        their_model = AutoModelForCausalLM.from_pretrained(exported)
        their_model.eval()  # type: ignore[no-untyped-call]
        their_eos = _eos_ids(their_model, their_tok)
        theirs = []
        for p in prompts:
            ids = encode_prompt(their_tok, p, system_prompt=system_prompt)
            theirs.append((ids, _greedy_torch(their_model, ids, their_eos, max_new_tokens)))
        runtime = "transformers"
    answers = [
        Answer(
            prompt=p if isinstance(p, str) else p[-1]["content"],
            checkpoint=tok.decode(a),
            export=tok.decode(b),
            same_prompt_tokens=their_ids == our_ids,
            same_completion=a == b,
        )
        for p, our_ids, a, (their_ids, b) in zip(prompts, ours, mine, theirs, strict=True)
    ]
    result = Fidelity(
        export=str(exported),
        runtime=runtime,
        outtype=outtype,
        max_new_tokens=max_new_tokens,
        identical=sum(a.same_completion and a.same_prompt_tokens for a in answers),
        n=len(answers),
        answers=answers,
    )
    if format_tags:
        rate = {
            side: sum(xml_format_score(getattr(a, side), format_tags) == 1.0 for a in answers)
            / len(answers)
            for side in ("checkpoint", "export")
        }
        result.format_rate = rate
    result.warning = _warning(result)
    store = (
        exported.with_name(exported.name + ".fidelity.json")
        if fmt == "gguf"
        else (exported / "grpokit_fidelity.json")
    )
    write_json(store, asdict(result) | {"summary": result.summary})
    if result.warning:
        log(f"warning: {result.warning}")
    return result


def _warning(result: Fidelity) -> str | None:
    """What a user must know before serving the export, or None."""
    if any(not a.same_prompt_tokens for a in result.answers):
        return (
            "the export encodes prompts unlike the checkpoint (its chat template, special "
            "tokens or BOS differ): it is prompted unlike it was trained"
        )
    safer = SAFER_TYPES.get(result.outtype)
    lost_format = (
        result.format_rate and result.format_rate["export"] < result.format_rate["checkpoint"]
    )
    if lost_format and safer:
        return (
            f"{result.outtype} loses the trained format (kept in "
            f"{result.format_rate['export']:.0%} of greedy answers, the checkpoint in "
            f"{result.format_rate['checkpoint']:.0%}): export --quantize {safer} or finer"
        )
    if result.identical < result.n and safer:
        return (
            f"{result.outtype} changes {result.n - result.identical} of {result.n} greedy "
            f"answers of the checkpoint; if they matter, compare with grpokit eval or export "
            f"--quantize {safer}"
        )
    return None


def fidelity_prompts(
    run_config: Any | None, n: int
) -> tuple[list[Prompt], str | None, list[str] | None]:
    """Up to ``n`` prompts for the check (the run's held-out prompts, else its training prompts,
    else :data:`FALLBACK_PROMPTS`), its system prompt and its xml_format tags."""
    from grpokit.rewards.audit.common import format_tags

    if run_config is None:
        return list(FALLBACK_PROMPTS[:n]), None, None
    rows = []
    for which in ("heldout", "train"):
        try:
            rows = run_config.prompts(which)
        except UserError:
            continue
        if rows:
            break
    prompts = [r.prompt for r in rows[:n]] or list(FALLBACK_PROMPTS[:n])
    return prompts, run_config.system_prompt, format_tags(run_config.rewards)


__all__ = ["Fidelity", "check_export", "fidelity_prompts"]
