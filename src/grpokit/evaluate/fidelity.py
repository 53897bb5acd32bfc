"""Does the exported model answer as the checkpoint did? Greedy completions of a few held-out
prompts from both, compared token for token.

``grpokit export`` runs this after writing the file: the checkpoint's greedy answers (PyTorch,
the weights as trained) against the export's in the runtime that serves it, transformers for an
HF directory and llama.cpp for a GGUF. Each side encodes the prompt as its runtime does (the
exported chat template and BOS), so a template or BOS that did not travel shows as different
prompt tokens, and a quantisation that changes the answers shows as different completions. The
result is printed as "k of n identical" and stored beside the export.

Two runtimes round differently (llama.cpp keeps its KV cache in float16), so where the checkpoint
itself barely prefers one token over another, an exact export can take the other and go on
differently from there. Where two answers part, the check reads both models' logits at that
token: a parting where the checkpoint held the two tokens within :data:`NEAR_TIE` of each other
is counted as a near tie, not as a changed answer. Beside it stands a value comparison: the
export's log-probabilities of the checkpoint's own greedy tokens, teacher-forced, against the
checkpoint's (the largest gap).
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

NEAR_TIE = 0.02
"""Largest margin (nats) between the checkpoint's token and the export's, in the checkpoint's own
logits, at which a parting counts as a near tie: the checkpoint preferred its token by less than
2% in probability. Measured on Qwen2.5 0.5B exported to f32 GGUF: llama.cpp's float16 KV cache
moves the log-probability of a greedy token by up to 0.004, so it can flip only ties closer than
about 0.008 (the one it flipped was 0.0001 apart); q8_0 moved them by up to 0.11, q4_k_m 0.55."""

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
    parts_at: int | None = None
    """Index of the first completion token where the two differ (None where they do not)."""
    checkpoint_margin: float | None = None
    """At ``parts_at``: the checkpoint's logit of its own token minus its logit of the export's
    (0 or more)."""
    logprob_gap: float | None = None
    """Largest |log p| difference between checkpoint and export over the checkpoint's greedy
    tokens, both teacher-forced on the same prompt (None where the prompt tokens differ)."""

    @property
    def near_tie(self) -> bool:
        """The answers part only where the checkpoint held both tokens within :data:`NEAR_TIE`."""
        return (
            not self.same_completion
            and self.same_prompt_tokens
            and self.checkpoint_margin is not None
            and self.checkpoint_margin < NEAR_TIE
        )


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
    near_ties: int = 0
    """Answers that part from the checkpoint's only at a near tie (see :attr:`Answer.near_tie`)."""
    logprob_gap: float | None = None
    """Largest :attr:`Answer.logprob_gap` over the answers."""

    @property
    def faithful(self) -> int:
        """Answers identical to the checkpoint's or parting from them only at a near tie."""
        return self.identical + self.near_ties

    @property
    def summary(self) -> str:
        tokens = sum(a.same_prompt_tokens for a in self.answers)
        ties = ""
        if self.near_ties:
            ties = f", {self.near_ties} more parting from it only at a near tie"
        line = (
            f"fidelity: {self.identical} of {self.n} greedy completions identical to the "
            f"checkpoint's{ties} ({self.runtime}, {self.outtype}, {self.max_new_tokens} new "
            f"tokens); prompt tokens identical in {tokens} of {self.n}"
        )
        if self.logprob_gap is not None:
            line += f"; its log-probs of the checkpoint's tokens within {self.logprob_gap:.2g}"
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


def _completion_logits(model: Any, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """A PyTorch model's logits for each token of ``completion`` and the one after it, read
    teacher-forced after ``prompt``: (len(completion) + 1, vocab), float64."""
    with torch.no_grad():
        logits: torch.Tensor = model(torch.tensor([prompt + completion])).logits
    return logits[0, len(prompt) - 1 :].double()


def _llama_cpp_side(
    path: Path,
    texts: Sequence[str],
    completions: Sequence[list[int]],
    max_new_tokens: int,
    context: int,
) -> list[tuple[list[int], list[int], torch.Tensor]]:
    """(prompt tokens, greedy completion, logits after the prompt along the checkpoint's
    completion) of each rendered prompt as llama.cpp's server has them: its own tokenizer, its BOS
    rule, a leading BOS the template wrote taken as that BOS."""
    from grpokit.models.gguf_runtime import GGUFModel, require_cyllama

    try:
        require_cyllama("the fidelity check of a GGUF export")
    except UserError as exc:
        raise UserError(f"{exc}, or pass --check 0") from exc
    with GGUFModel(path, n_ctx=context, n_threads=max(1, torch.get_num_threads())) as llm:
        bos_text = llm.token_text(llm.token_bos)
        out = []
        for text, checkpoint_answer in zip(texts, completions, strict=True):
            if llm.adds_bos and text.startswith(bos_text):
                text = text[len(bos_text) :]
            prompt = llm.tokenize(text, add_bos=True, special=True)
            greedy = llm.greedy(prompt, max_new_tokens, stop_at_end=True)
            rows = llm.logits(prompt + checkpoint_answer, first=len(prompt) - 1)
            out.append((prompt, greedy, torch.tensor(rows, dtype=torch.float64)))
        return out


def _transformers_side(
    path: Path,
    prompts: Sequence[Prompt],
    completions: Sequence[list[int]],
    system_prompt: str | None,
    max_new_tokens: int,
) -> list[tuple[list[int], list[int], torch.Tensor]]:
    """As :func:`_llama_cpp_side`, for an HF export in transformers: its own tokenizer and chat
    template encode the prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    model.eval()  # type: ignore[no-untyped-call]
    eos = _eos_ids(model, tokenizer)
    out = []
    for prompt, checkpoint_answer in zip(prompts, completions, strict=True):
        ids = encode_prompt(tokenizer, prompt, system_prompt=system_prompt)
        greedy = _greedy_torch(model, ids, eos, max_new_tokens)
        out.append((ids, greedy, _completion_logits(model, ids, checkpoint_answer)))
    return out


def _compare(
    prompt: Prompt,
    ids: tuple[list[int], list[int]],
    completions: tuple[list[int], list[int]],
    logits: tuple[torch.Tensor, torch.Tensor],
    decode: Callable[[list[int]], str],
) -> Answer:
    """One prompt's answers, checkpoint first then export in each pair: where they part, and by
    how much the export's log-probs of the checkpoint's tokens differ (both teacher-forced).

    ``logits``: each side's logits after the prompt along the checkpoint's completion,
    (len(checkpoint completion) + 1, vocab)."""
    mine, theirs = completions
    answer = Answer(
        prompt=prompt if isinstance(prompt, str) else prompt[-1]["content"],
        checkpoint=decode(mine),
        export=decode(theirs),
        same_prompt_tokens=ids[0] == ids[1],
        same_completion=mine == theirs,
    )
    if not answer.same_prompt_tokens:
        return answer  # the two read different prompts: their logits are not comparable
    ours, exported = logits
    if ours.shape[-1] != exported.shape[-1]:  # a padded vocabulary: compare the shared part
        vocab = min(ours.shape[-1], exported.shape[-1])
        ours, exported = ours[:, :vocab], exported[:, :vocab]
    target = torch.tensor(mine, dtype=torch.long)[:, None]
    gaps = ours[:-1].log_softmax(-1).gather(1, target) - exported[:-1].log_softmax(-1).gather(
        1, target
    )
    answer.logprob_gap = float(gaps.abs().max()) if len(mine) else 0.0
    if not answer.same_completion:
        # The first token where they differ; the prefix before it is the same on both sides, so
        # both rows there are the two models' logits after the same tokens. Past the end of a
        # completion, its side ended: its choice there is the row's top token (an end token).
        at = next(
            (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
            min(len(mine), len(theirs)),
        )
        ours_row = ours[at]
        a = mine[at] if at < len(mine) else int(ours_row.argmax())
        b = theirs[at] if at < len(theirs) else int(exported[at].argmax())
        answer.parts_at = at
        answer.checkpoint_margin = max(0.0, float(ours_row[a] - ours_row[b]))
    return answer


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
    our_logits = [_completion_logits(model, ids, c) for ids, c in zip(ours, mine, strict=True)]
    if fmt == "gguf":
        texts = [render_prompt(tok, p, system_prompt=system_prompt) for p in prompts]
        context = max(len(ids) for ids in ours) + max_new_tokens + 8
        theirs = _llama_cpp_side(exported, texts, mine, max_new_tokens, context)
        runtime = "llama.cpp"
    else:
        theirs = _transformers_side(exported, prompts, mine, system_prompt, max_new_tokens)
        runtime = "transformers"
    answers = [
        _compare(p, (our_ids, their_ids), (a, b), (our_rows, their_rows), tok.decode)
        for p, our_ids, a, our_rows, (their_ids, b, their_rows) in zip(
            prompts, ours, mine, our_logits, theirs, strict=True
        )
    ]
    gaps = [a.logprob_gap for a in answers if a.logprob_gap is not None]
    result = Fidelity(
        export=str(exported),
        runtime=runtime,
        outtype=outtype,
        max_new_tokens=max_new_tokens,
        identical=sum(a.same_completion and a.same_prompt_tokens for a in answers),
        n=len(answers),
        answers=answers,
        near_ties=sum(a.near_tie for a in answers),
        logprob_gap=max(gaps) if gaps else None,
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
    record = asdict(result) | {"faithful": result.faithful, "summary": result.summary}
    for row, answer in zip(record["answers"], answers, strict=True):
        row["near_tie"] = answer.near_tie
    write_json(store, record)
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
    if result.faithful < result.n and safer:
        return (
            f"{result.outtype} changes {result.n - result.faithful} of {result.n} greedy "
            f"answers of the checkpoint; if they matter, compare with grpokit eval or export "
            f"--quantize {safer}"
        )
    return None


def fidelity_prompts(
    run_config: Any | None, n: int
) -> tuple[list[Prompt], str | None, list[str] | None]:
    """Up to ``n`` prompts for the check (the run's held-out prompts, else its training prompts,
    else :data:`FALLBACK_PROMPTS`), its system prompt and its xml_format tags."""
    from grpokit.config import load_prompt_rows
    from grpokit.rewards.audit.common import format_tags

    if run_config is None:
        return list(FALLBACK_PROMPTS[:n]), None, None
    rows = []
    for which in ("heldout", "train"):
        try:
            rows = load_prompt_rows(run_config, which)
        except UserError:
            continue
        if rows:
            break
    prompts = [r.prompt for r in rows[:n]] or list(FALLBACK_PROMPTS[:n])
    return prompts, run_config.system_prompt, format_tags(run_config.rewards)


__all__ = ["Fidelity", "check_export", "fidelity_prompts"]
