"""A judge model run in-process with transformers, for runs without a server.

The judge prompt goes through the model's chat template as one user message; the reply is
generated greedily (or sampled at the configured temperature) in batches. For the expected mode
the next-token distribution is read straight from the raw logits at every generated position,
so the same probability-weighted scoring applies as with a server's top logprobs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, cast

import torch

from grpokit.errors import UserError
from grpokit.rewards.judge.backends.base import JudgeReply
from grpokit.rewards.judge.config import LocalJudge
from grpokit.rewards.judge.expected import TokenLogprob

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class LocalBackend:
    """A Hugging Face causal LM judging in this process."""

    def __init__(self, spec: LocalJudge, *, where: str) -> None:
        from transformers import AutoModelForCausalLM

        from grpokit.hub.resolve import load_tokenizer, resolve_model_path

        self.spec = spec
        self.where = where
        self.device = _pick_device(spec.device)
        if spec.dtype == "auto":
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        else:
            dtype = _DTYPES[spec.dtype]
        try:
            path = resolve_model_path(spec.model)
            # Any: transformers' stubs type decode() and generate() too loosely to be useful.
            self.tokenizer: Any = cast(Any, load_tokenizer(path))
            self.model: Any = cast(Any, AutoModelForCausalLM.from_pretrained(path, dtype=dtype))
        except UserError as exc:
            raise UserError(f"{where}.model: {exc}") from exc
        except (OSError, ValueError) as exc:
            raise UserError(
                f"{where}.model: cannot load judge model {spec.model!r} ({exc}). Use a local "
                "model directory or the embedded default smollm2-135m-instruct."
            ) from exc
        self.model.to(self.device)
        self.model.eval()
        self.model.requires_grad_(False)
        self._path = path

    @property
    def identity(self) -> str:
        s = self.spec
        return json.dumps(["local", self._path, s.temperature, s.max_tokens, s.top_logprobs])

    @property
    def description(self) -> str:
        return f"local {self.spec.model}"

    def _encode(self, prompt: str) -> list[int]:
        messages = [{"role": "user", "content": prompt}]
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return [int(i) for i in ids]
        return [int(i) for i in self.tokenizer(prompt)["input_ids"]]

    def complete(self, prompts: Sequence[str], *, logprobs: bool) -> list[JudgeReply]:
        replies: list[JudgeReply] = []
        for start in range(0, len(prompts), self.spec.batch_size):
            chunk = prompts[start : start + self.spec.batch_size]
            try:
                replies.extend(self._complete_batch(chunk, logprobs))
            except torch.cuda.OutOfMemoryError as exc:
                replies.extend(JudgeReply.failed(f"out of memory: {exc}") for _ in chunk)
        return replies

    @torch.no_grad()
    def _complete_batch(self, prompts: Sequence[str], logprobs: bool) -> list[JudgeReply]:
        encoded = [self._encode(p) for p in prompts]
        width = max(len(ids) for ids in encoded)
        pad_id = int(self.tokenizer.pad_token_id)
        # Left padding: every row's next token is then at the same position.
        input_ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, ids in enumerate(encoded):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids) :] = 1
        sampling = self.spec.temperature > 0
        generate_kwargs: dict[str, Any] = {
            "input_ids": input_ids.to(self.device),
            "attention_mask": attention.to(self.device),
            "max_new_tokens": self.spec.max_tokens,
            "do_sample": sampling,
            "pad_token_id": pad_id,
            "return_dict_in_generate": True,
            "output_logits": logprobs,
        }
        if sampling:
            generate_kwargs.update(temperature=self.spec.temperature, top_k=0, top_p=1.0)
        out = self.model.generate(**generate_kwargs)
        generated = out.sequences[:, width:].cpu()
        eos_ids = self._eos_ids()
        replies: list[JudgeReply] = []
        for row in range(len(encoded)):
            reply_ids: list[int] = []
            for token in generated[row].tolist():
                if token in eos_ids:
                    break
                reply_ids.append(int(token))
            text: str = self.tokenizer.decode(reply_ids, skip_special_tokens=True)
            usage = (len(encoded[row]), len(reply_ids))
            if not logprobs:
                replies.append(JudgeReply(text=text, usage=usage))
                continue
            step_logits = [step[row] for step in out.logits]
            reply = self._with_logprobs(reply_ids, text, step_logits)
            replies.append(dataclasses.replace(reply, usage=usage))
        return replies

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, list):
                ids.update(int(i) for i in source)
        return ids

    def _with_logprobs(self, ids: list[int], text: str, logits: list[torch.Tensor]) -> JudgeReply:
        """Attach per-position top-k logprobs, with offsets computed from decoded prefixes (a
        token alone may decode to a partial character)."""
        tokens: list[TokenLogprob] = []
        previous = ""
        for position, token_id in enumerate(ids):
            upto: str = self.tokenizer.decode(ids[: position + 1], skip_special_tokens=True)
            if not upto.startswith(previous):
                # Decoding is not prefix-stable here (a byte-level merge); offsets are unusable.
                return JudgeReply(text=text)
            log_probs = torch.log_softmax(logits[position].float(), dim=-1)
            top_values, top_ids = torch.topk(log_probs, self.spec.top_logprobs)
            top = tuple(
                (self.tokenizer.decode([int(i)], skip_special_tokens=True), float(v))
                for v, i in zip(top_values.tolist(), top_ids.tolist(), strict=True)
            )
            tokens.append(
                TokenLogprob(
                    offset=len(previous),
                    token=upto[len(previous) :],
                    logprob=float(log_probs[token_id]),
                    top=top,
                )
            )
            previous = upto
        if previous != text:
            return JudgeReply(text=text)
        return JudgeReply(text=text, tokens=tuple(tokens))

    def close(self) -> None:
        # Drop the references so the weights can be freed; the object is unusable afterwards.
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
