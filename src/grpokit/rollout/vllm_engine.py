"""vLLM as a rollout engine for GPU machines (optional extra: ``pip install grpokit[vllm]``).

Two modes, one interface (:class:`~grpokit.rollout.base.RolloutEngine`):

- ``colocate``: a vLLM ``LLM`` lives in the training process, on the training GPU, taking
  ``gpu_memory_utilization`` of its memory. After every optimizer step :meth:`VLLMEngine.sync_weights`
  copies the policy's current weights into it (under LoRA the adapter is merged for the copy and
  unmerged afterwards, so vLLM always runs plain dense weights and needs no LoRA support).
- ``server``: generation runs on a separate GPU in TRL's server (``trl vllm-serve --model DIR``,
  the same server TRL users already run); weights go to it over NCCL through TRL's client.

vLLM and TRL are imported only when an engine is built, so grpokit imports without them. Both
report log-probabilities of the temperature-scaled distribution (vLLM's ``processed_logprobs``),
which is :class:`RolloutBatch`'s contract when top-k and top-p are off; the trainer recomputes
the log-probabilities it optimises either way.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Iterator
from typing import Any, Literal

import torch

from grpokit.errors import UserError
from grpokit.rollout.base import FinishReason, RolloutBatch, SamplingParams

VLLMMode = Literal["colocate", "server"]


def vllm_available() -> bool:
    """Whether vLLM can be imported and a CUDA device is present (vLLM's GPU backend needs one)."""
    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


def _require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise UserError(
            "rollout engine 'vllm' needs the vllm package: pip install 'grpokit[vllm]' (on a CUDA "
            "machine), or use the default torch engine"
        )
    if not torch.cuda.is_available():
        raise UserError(
            "rollout engine 'vllm' needs a CUDA GPU and none is visible; use the default torch "
            "engine on this machine"
        )


def vllm_param_name(name: str) -> str | None:
    """The name vLLM's ``load_weights`` knows a (merged) training parameter by, or None to skip.

    peft wraps the model (``base_model.model.``), keeps the frozen weight of an adapted layer as
    ``<layer>.base_layer.weight`` and its trainable copies of ``modules_to_save`` as
    ``<layer>.modules_to_save.default.weight``; the LoRA factors themselves are not weights of the
    dense model (they are merged into ``base_layer`` before the copy).
    """
    if "lora_" in name or ".original_module." in name:
        return None
    name = name.removeprefix("base_model.model.")
    name = name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
    return name.replace("_checkpoint_wrapped_module.", "")


def dense_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(vLLM name, tensor) for every weight of the dense model, LoRA merged in.

    Must be consumed inside :func:`merged_adapter` when the model is a peft model.
    """
    for name, param in model.named_parameters():
        target = vllm_param_name(name)
        if target is not None:
            yield target, param.data
    for name, buf in model.named_buffers():
        target = vllm_param_name(name)
        # Rotary tables and the like are recomputed by vLLM; only persistent state would matter.
        if target is not None and not name.endswith(("inv_freq", "original_inv_freq")):
            yield target, buf


class merged_adapter:  # noqa: N801 - used as a context manager
    """Merge a peft model's adapter into its base weights for the duration of a block."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.is_peft = callable(getattr(model, "merge_adapter", None))

    def __enter__(self) -> torch.nn.Module:
        if self.is_peft:
            with torch.no_grad():
                self.model.merge_adapter()  # type: ignore[operator]
        return self.model

    def __exit__(self, *exc: object) -> None:
        if self.is_peft:
            with torch.no_grad():
                self.model.unmerge_adapter()  # type: ignore[operator]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def finish_reason(tokens: list[int], eos_token_ids: set[int]) -> FinishReason:
    return "eos" if tokens and tokens[-1] in eos_token_ids else "length"


class VLLMEngine:
    """A :class:`~grpokit.rollout.base.RolloutEngine` backed by vLLM.

    Args:
        model: the training policy (transformers or peft); its weights are pushed to vLLM by
            :meth:`sync_weights`.
        model_path: directory (or hub name) vLLM loads the architecture and first weights from;
            for ``server`` mode, the server must have been started on the same model.
        eos_token_ids: tokens that end a completion (kept in it, as the torch engine does).
        mode: ``colocate`` or ``server``.
        gpu_memory_utilization: share of the GPU vLLM may take in colocate mode (the rest stays
            for training).
        max_model_len: longest prompt + completion; default the model's limit.
        server_url: ``http://host:port`` of ``trl vllm-serve`` (server mode).
        seed: vLLM's sampling seed (colocate; a per-call generator cannot drive vLLM's sampler).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        model_path: str,
        eos_token_ids: list[int],
        mode: VLLMMode = "colocate",
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        server_url: str = "http://127.0.0.1:8000",
        dtype: str = "auto",
        seed: int = 0,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("VLLMEngine needs at least one EOS token id")
        _require_vllm()
        self.model = model
        self.mode = mode
        self.eos_token_ids = sorted(set(eos_token_ids))
        self._llm: Any = None
        self._client: Any = None
        if mode == "colocate":
            # One engine per training process, driven in-process, so load_weights reaches the
            # model directly (no engine subprocess).
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
                os.environ.setdefault(key, value)
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            from vllm import LLM

            rank = int(os.environ["RANK"])
            self._llm = LLM(
                model=model_path,
                dtype=dtype,
                gpu_memory_utilization=gpu_memory_utilization,
                max_model_len=max_model_len,
                seed=seed + rank,  # data-parallel ranks sample different completions
                distributed_executor_backend="external_launcher",
                logprobs_mode="processed_logprobs",
                enable_prefix_caching=True,  # a group's G requests share their prompt's cache
            )
        elif mode == "server":
            from trl.generation.vllm_client import VLLMClient

            self._client = VLLMClient(base_url=server_url, connection_timeout=120.0)
            device = next(model.parameters()).device
            self._client.init_communicator(device=device.index or 0)
        else:
            raise UserError(f"vllm mode must be 'colocate' or 'server', got {mode!r}")

    # ---- weights -------------------------------------------------------------------------------

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Push the policy's current weights to vLLM (after every optimizer step)."""
        with merged_adapter(self.model) as model:
            if self._llm is not None:
                runner_model = self._llm.llm_engine.model_executor.driver_worker.model_runner.model
                runner_model.load_weights(dense_weights(model))
                self._llm.reset_prefix_cache()
            else:
                weights = list(dense_weights(model))
                metadata = [
                    (n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in weights
                ]
                self._client.update_named_params(metadata, iter(weights))
                self._client.reset_prefix_cache()

    # ---- generation ----------------------------------------------------------------------------

    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        """Sample ``n`` completions per prompt (group-major rows, as :class:`RolloutBatch`)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not prompt_ids or any(len(ids) == 0 for ids in prompt_ids):
            raise ValueError("generate needs at least one prompt, and no prompt may be empty")
        temperature = params.temperature if not params.greedy else 0.0
        if self._llm is not None:
            completions, logprobs = self._generate_local(prompt_ids, n, params, temperature)
        else:
            completions, logprobs = self._generate_server(prompt_ids, n, params, temperature)
        eos = set(self.eos_token_ids)
        return RolloutBatch(
            prompt_ids=[list(p) for p in prompt_ids],
            completion_ids=completions,
            logprobs=[torch.tensor(lp, dtype=torch.float32) for lp in logprobs],
            finish_reason=[finish_reason(c, eos) for c in completions],
            group_size=n,
        )

    def _generate_local(
        self, prompt_ids: list[list[int]], n: int, params: SamplingParams, temperature: float
    ) -> tuple[list[list[int]], list[list[float]]]:
        from vllm import SamplingParams as VSamplingParams

        sampling = VSamplingParams(
            n=n,
            temperature=temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            min_p=params.min_p,
            repetition_penalty=params.repetition_penalty,
            max_tokens=params.max_completion_length,
            stop_token_ids=self.eos_token_ids,
            logprobs=0,
            detokenize=False,
        )
        outputs = self._llm.generate(
            [{"prompt_token_ids": ids} for ids in prompt_ids], sampling, use_tqdm=False
        )
        completions: list[list[int]] = []
        logprobs: list[list[float]] = []
        for request in outputs:  # vLLM returns requests in input order, n outputs each
            for out in sorted(request.outputs, key=lambda o: o.index):
                tokens = list(out.token_ids)
                completions.append(tokens)
                per_token = out.logprobs or []
                logprobs.append(
                    [float(step[tok].logprob) for step, tok in zip(per_token, tokens, strict=False)]
                )
        return completions, logprobs

    def _generate_server(
        self, prompt_ids: list[list[int]], n: int, params: SamplingParams, temperature: float
    ) -> tuple[list[list[int]], list[list[float]]]:
        reply = self._client.generate(
            prompt_ids,
            n=n,
            temperature=temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            min_p=params.min_p,
            repetition_penalty=params.repetition_penalty,
            max_tokens=params.max_completion_length,
            logprobs=0,
            generation_kwargs={"stop_token_ids": self.eos_token_ids},
        )
        completions = [list(c) for c in reply["completion_ids"]]
        raw = reply.get("logprobs") or [[] for _ in completions]
        # One list per token holding the sampled token's log-prob first.
        logprobs = [[float(step[0]) for step in row] for row in raw]
        return completions, logprobs
