"""Loading the policy, its tokenizer and its reference model.

The reference model is the one training starts from: after an ``init_from`` warm start (a full
checkpoint or a merged LoRA adapter), not the original base. Under LoRA the reference is the same
network with the adapter disabled, so no second copy is held in memory.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import PreTrainedTokenizerBase

from grpokit.errors import UserError
from grpokit.files import set_default_mode
from grpokit.hub.embedded import EMBEDDED_MODEL
from grpokit.hub.resolve import hub_error, load_tokenizer, pad_token_id, resolve_model_path
from grpokit.models.attention import use_float32_attention_backward
from grpokit.models.manifest import CheckpointDamaged, check_model
from grpokit.models.onednn import (
    CpuMatmul,
    bf16_compute_applies,
    compute_dtype,
    set_compute_dtype,
    store_frozen_linears_in_compute_dtype,
    use_onednn_linears,
)

DType = Literal["auto", "float32", "bfloat16", "float16"]
"""Weights' dtype; "auto" keeps float32 weights and computes in bfloat16 where the CPU has it
(see :func:`load_policy`)."""

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

POLICY_FILE = "grpokit_policy.json"
"""Written by :meth:`Policy.save`: what a checkpoint is (adapter or full) and what it builds on,
so a LoRA adapter trained on top of a warm start can be loaded back onto the same weights."""


@dataclass(frozen=True)
class LoraSettings:
    """LoRA hyperparameters (peft's ``LoraConfig`` names: r, lora_alpha, lora_dropout)."""

    r: int
    alpha: float
    dropout: float = 0.0
    target_modules: list[str] | str = "all-linear"


def _check_not_quantised(config: Any, where: str) -> None:
    if getattr(config, "quantization_config", None) is not None:
        raise UserError(
            f"Model '{where}' is quantised (its config has a quantization_config); grpokit trains "
            "unquantised weights. Use an unquantised model directory (for the embedded default, "
            f"'{EMBEDDED_MODEL}', grpokit converts the GGUF for you)."
        )


def _load_causal_lm(name_or_path: str, resolved: str, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(resolved)
    except (OSError, ValueError) as exc:
        raise hub_error(name_or_path, exc) from exc
    _check_not_quantised(config, name_or_path)
    try:
        model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(resolved, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise hub_error(name_or_path, exc) from exc
    except RuntimeError as exc:  # transformers' refusal of tensors of the wrong shape
        raise UserError(
            f"Model '{name_or_path}': its weights do not fit its config.json ({exc}); the "
            "checkpoint is damaged, or its files come from different models."
        ) from None
    # A quantisation method can also be attached at load time without being in config.json.
    _check_not_quantised(getattr(model, "config", None), name_or_path)
    if getattr(model, "hf_quantizer", None) is not None:
        raise UserError(
            f"Model '{name_or_path}' loaded as a quantised model; grpokit trains unquantised "
            "weights. Use an unquantised model directory."
        )
    return model


def _read_policy_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads((path / POLICY_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UserError(f"Checkpoint file {path / POLICY_FILE} is unreadable: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _merge_adapter(model: torch.nn.Module, adapter_dir: Path) -> torch.nn.Module:
    from peft import PeftModel

    try:
        peft_model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise UserError(
            f"init_from '{adapter_dir}': the LoRA adapter does not fit the base model ({exc}). "
            "Use the same base model the adapter was trained on."
        ) from exc
    merged: torch.nn.Module = peft_model.merge_and_unload()
    # peft loads an adapter for inference (base frozen); the merged weights are the new base,
    # trainable unless a fresh LoRA freezes them again.
    merged.requires_grad_(True)
    return merged


def _apply_init_from(
    model_name: str, init_from: Path, dtype: torch.dtype
) -> tuple[torch.nn.Module, str]:
    """The starting weights: a full checkpoint loaded as is, or an adapter merged into the weights
    it was trained on (recursively, when that adapter was itself trained on a warm start).

    Returns the model and the directory the tokenizer should come from.
    """
    if not init_from.is_dir():
        raise UserError(
            f"init_from '{init_from}' is not a directory. Give a checkpoint directory written by "
            "grpokit (a full model or a LoRA adapter)."
        )
    try:
        check_model(init_from)
    except CheckpointDamaged as exc:
        raise UserError(f"init_from '{init_from}': a damaged checkpoint: {exc}") from None
    if (init_from / "adapter_config.json").is_file():
        info = _read_policy_file(init_from)
        inner = info.get("init_from")
        if isinstance(inner, str) and inner:
            base, tokenizer_dir = _apply_init_from(model_name, Path(inner), dtype)
        else:
            tokenizer_dir = resolve_model_path(model_name)
            base = _load_causal_lm(model_name, tokenizer_dir, dtype)
        # The adapter's own tokenizer is the one its run prompted with (model.chat_template
        # applied); the base's would export and evaluate the model with another template.
        if (init_from / "tokenizer_config.json").is_file():
            tokenizer_dir = str(init_from)
        return _merge_adapter(base, init_from), tokenizer_dir
    if (init_from / "config.json").is_file():
        model = _load_causal_lm(str(init_from), str(init_from), dtype)
        has_tokenizer = (init_from / "tokenizer_config.json").is_file()
        return model, str(init_from) if has_tokenizer else resolve_model_path(model_name)
    raise UserError(
        f"init_from '{init_from}' holds neither adapter_config.json (a LoRA adapter) nor "
        "config.json (a full model). Give a checkpoint directory written by grpokit."
    )


_adapter_layers: weakref.WeakKeyDictionary[torch.nn.Module, list[Any]] = weakref.WeakKeyDictionary()
"""Each peft model's adapter layers, found once (see :func:`adapters_disabled`)."""


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """What peft's ``model.disable_adapter()`` does for LoRA: every adapter layer (and
    modules-to-save wrapper) switched off inside, the enabled ones switched on again after.

    peft's own context manager walks all modules three times per use (a status check, then off,
    then on); the layers are found once here. Measured: 80 ms of a 2.3 s LoRA step of the
    embedded model, where the reference forward needs it once a step.
    """
    layers = _adapter_layers.get(model)
    if layers is None:
        from peft.tuners.tuners_utils import BaseTunerLayer
        from peft.utils.other import AuxiliaryTrainingWrapper

        # The modules peft's own disable_adapter() switches.
        switched = (BaseTunerLayer, AuxiliaryTrainingWrapper)
        layers = [m for m in model.modules() if isinstance(m, switched)]
        _adapter_layers[model] = layers
    enabled = [m for m in layers if not m.disable_adapters]
    # The model's own mark, which peft's has_active_enabled_adapter reads, as peft sets it.
    was_disabled = getattr(model, "_adapters_disabled", None)
    for m in enabled:
        m.enable_adapters(False)
    if was_disabled is not None:
        model._adapters_disabled = True  # type: ignore[assignment]
    try:
        yield
    finally:
        for m in enabled:
            m.enable_adapters(True)
        if was_disabled is not None:
            model._adapters_disabled = was_disabled


@dataclass
class Policy:
    """The model being trained, its tokenizer and its reference.

    ``model`` is a peft ``PeftModel`` under LoRA. ``reference`` is a frozen copy only for full
    fine-tuning with a reference needed; under LoRA the reference is ``model`` with its adapter
    disabled (see :meth:`reference_model`).
    """

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    reference: torch.nn.Module | None
    uses_adapter: bool
    base_name_or_path: str = ""
    init_from: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    narrowed: tuple[str, ...] = ()
    """The frozen base layers (``model.named_modules()`` names) whose weights
    :meth:`narrow_frozen_base` stored in the compute dtype."""

    @contextlib.contextmanager
    def reference_model(self) -> Iterator[torch.nn.Module]:
        """The module to run for reference log-probs: the frozen copy, or under LoRA the same
        network with its adapter layers off (:func:`adapters_disabled`). Raises if there is no
        reference."""
        if self.reference is not None:
            yield self.reference
        elif self.uses_adapter:
            with adapters_disabled(self.model):
                yield self.model
        else:
            raise RuntimeError(
                "This policy has no reference model: load it with need_reference=True "
                "(needed when beta > 0)."
            )

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the linear layers compute in: bfloat16 under ``dtype: auto`` on a CPU with
        native bf16 (weights and optimizer state stay float32), else the weights' own."""
        marked = compute_dtype(self.model)
        return marked if marked is not None else next(self.model.parameters()).dtype

    def narrow_frozen_base(self) -> int:
        """Under LoRA with a compute dtype (``dtype: auto`` on a CPU with bfloat16 products), store
        the frozen base layers' weights in that dtype
        (grpokit.models.onednn.store_frozen_linears_in_compute_dtype); returns how many.

        Every forward casts them to it anyway, so the products are the same to the bit, while
        the float32 copy goes: 4 of the 6 bytes a base weight held (the float32 weight and its
        cast kept between forwards; measured in bench/README.md on Qwen2.5-Coder).
        A head tied to the embedding keeps its tie (the embedding stays float32). A merged save
        reads the float32 weights from the model's files again (:meth:`save`), so it writes what
        it wrote before. Nothing changes for full fine-tuning or without a compute dtype.
        """
        if not self.uses_adapter:
            return 0
        names = store_frozen_linears_in_compute_dtype(self.model, shared=False)
        self.narrowed = (*self.narrowed, *names)
        if names:
            # transformers maps each weights file into memory and reads the float32 tensors
            # from the map; the map stays while any tensor of the file lives, and with it every
            # page the narrowing read (the file's whole size, resident until the kernel reclaims
            # it). Copying out the frozen float32 rest (embedding, norms, biases) lets it go:
            # measured on Qwen2.5-Coder-1.5B-Instruct, 7.9 GiB resident after narrowing -> 3.9.
            with torch.no_grad():
                for param in self.model.parameters():
                    if not param.requires_grad and param.dtype == torch.float32:
                        param.data = param.data.clone()
        return len(names)

    def _restore_float32_base(self, model: torch.nn.Module) -> None:
        """Put the float32 weights of the narrowed layers back into ``model`` (a copy of
        :attr:`model`), loaded from the files the policy was loaded from."""
        if self.init_from is not None:
            base, _ = _apply_init_from(self.base_name_or_path, Path(self.init_from), torch.float32)
        else:
            path = resolve_model_path(self.base_name_or_path)
            base = _load_causal_lm(self.base_name_or_path, path, torch.float32)
        originals = dict(base.named_modules())
        modules = dict(model.named_modules())
        for name in self.narrowed:
            # peft's names: base_model.model.<the base model's name>.base_layer
            original = originals[name.removeprefix("base_model.model.").removesuffix(".base_layer")]
            weight = original.weight.detach()
            if weight.shape != modules[name].weight.shape:
                raise RuntimeError(f"{name}: the base model's files changed since it was loaded")
            modules[name].weight = torch.nn.Parameter(weight, requires_grad=False)

    def eos_token_ids(self) -> list[int]:
        """Token ids that end a completion: the tokenizer's EOS and any the generation config lists."""
        tok = self.tokenizer
        ids = {int(tok.eos_token_id)} if tok.eos_token_id is not None else set()
        extra = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(extra, int):
            ids.add(extra)
        elif isinstance(extra, list):
            ids.update(int(x) for x in extra)
        if not ids:
            raise UserError(
                "the tokenizer has no eos_token; set one in the model's tokenizer config"
            )
        return sorted(ids)

    @property
    def pad_token_id(self) -> int:
        """The id that pads prompts and completions in a batch (never attended to)."""
        return pad_token_id(self.tokenizer)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates (LoRA weights only under LoRA)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def save(
        self,
        path: Path,
        *,
        merged: bool = False,
        state_dict: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """Write a checkpoint: the LoRA adapter (or, with ``merged``, the base with the adapter
        merged in) or the full model, plus the tokenizer and a ``grpokit_policy.json``.

        ``state_dict`` holds the weights to write in place of the model's own (whole tensors
        gathered from a sharded model); not with ``merged``.
        The directory appears complete or not at all (written beside it, then renamed); an
        existing checkpoint at ``path`` is replaced.
        """
        if merged and state_dict is not None:
            raise ValueError("save(merged=True) merges the model's own weights; omit state_dict")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        set_default_mode(tmp)  # mkdtemp's 0700 would hide the checkpoint from other accounts
        try:
            kind = "adapter" if self.uses_adapter and not merged else "full"
            if self.uses_adapter and merged:
                # Merge a copy: merging in place would change the weights being trained.
                full = copy.deepcopy(self.model)
                if self.narrowed:
                    self._restore_float32_base(full)
                full = full.merge_and_unload()  # type: ignore[operator]
                full.save_pretrained(tmp)
            else:
                self.model.save_pretrained(tmp, state_dict=state_dict)  # type: ignore[operator]
            self.tokenizer.save_pretrained(tmp)
            info = {
                "kind": kind,
                "base_model": self.base_name_or_path,
                # An adapter is relative to the weights it was trained on, which include the warm
                # start; a full or merged checkpoint already contains it.
                "init_from": self.init_from if kind == "adapter" else None,
                **self.metadata,
            }
            (tmp / POLICY_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
            if path.exists():
                stale = path.with_name(f".{path.name}.old-{os.getpid()}-{time.time_ns()}")
                os.rename(path, stale)
                os.rename(tmp, path)
                shutil.rmtree(stale, ignore_errors=True)
            else:
                os.rename(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def load_policy(
    name_or_path: str,
    *,
    dtype: DType = "float32",
    lora: LoraSettings | None = None,
    gradient_checkpointing: bool = False,
    need_reference: bool,
    init_from: str | Path | None = None,
    device: str | torch.device = "cpu",
    cpu_matmul: CpuMatmul = "auto",
) -> Policy:
    """Load the policy to train, with its tokenizer and (if needed) its reference.

    Args:
        name_or_path: the embedded name, a local model directory, or a hub name.
        dtype: weights' dtype. "auto": float32 weights; where the CPU multiplies bfloat16
            natively (AVX512-BF16 or AMX) and oneDNN is used (``cpu_matmul`` not "torch"), the
            model (and its reference) is marked to compute in bfloat16: training forwards under
            CPU autocast (grpokit.models.onednn.compute_autocast), decoding with a bfloat16
            copy of the weights. Elsewhere (other CPUs, CUDA) "auto" is float32.
        lora: LoRA settings, or None for full fine-tuning.
        gradient_checkpointing: recompute activations in the backward pass (less memory).
        need_reference: whether a reference model is needed (beta > 0). Under LoRA the adapter
            is disabled to get it, so this only decides whether a frozen copy is made.
        init_from: a grpokit checkpoint to start from (full model or LoRA adapter; an adapter is
            merged into the base first). The reference is these starting weights.
        device: where the model lives.
        cpu_matmul: linear layers' library on CPU (see grpokit.models.onednn).

    The returned model is in train mode; the reference (a copy) is in eval mode and frozen.
    """
    weights_dtype = _weights_dtype(dtype)
    bf16 = dtype == "auto" and bf16_compute_applies(torch.device(device), cpu_matmul)
    start = _load_start(name_or_path, init_from, weights_dtype, device)
    # Copied before checkpointing and LoRA change the model: the starting weights, on the device.
    reference = _frozen_copy(start.model) if need_reference and lora is None else None
    model = _trainable(start.model, lora, gradient_checkpointing=gradient_checkpointing)
    _set_compute(model, reference, cpu_matmul, bf16=bf16)
    model.train()
    return Policy(
        model=model,
        tokenizer=start.tokenizer,
        reference=reference,
        uses_adapter=lora is not None,
        base_name_or_path=name_or_path,
        init_from=start.init_from,
    )


def _weights_dtype(dtype: DType) -> torch.dtype:
    """The dtype the weights load in: float32 under "auto" (bfloat16, where it applies, is a
    compute dtype, not a storage one). An unknown name fails here, before any weights load."""
    if dtype not in _DTYPES and dtype != "auto":
        raise UserError(f"dtype '{dtype}' is not supported; use auto or one of {sorted(_DTYPES)}.")
    return _DTYPES["float32" if dtype == "auto" else dtype]


@dataclass(frozen=True)
class _Start:
    """The weights training starts from (on the device), their tokenizer, and the warm start
    they came from (the resolved path :attr:`Policy.init_from` records) or None."""

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    init_from: str | None


def _load_start(
    name_or_path: str, init_from: str | Path | None, dtype: torch.dtype, device: str | torch.device
) -> _Start:
    """Load the base model, or the ``init_from`` checkpoint when given (:func:`_apply_init_from`),
    so that the policy and its reference start from the warm start; then the tokenizer that
    goes with those weights, and move the model to the device."""
    if init_from is not None:
        init_path = Path(init_from).expanduser()
        model, tokenizer_dir = _apply_init_from(name_or_path, init_path, dtype)
        init_str: str | None = str(init_path.resolve())
    else:
        tokenizer_dir = resolve_model_path(name_or_path)
        model = _load_causal_lm(name_or_path, tokenizer_dir, dtype)
        init_str = None
    tokenizer = load_tokenizer(tokenizer_dir)
    model.to(device)
    return _Start(model, tokenizer, init_str)


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` in eval mode without gradients: the reference of full fine-tuning,
    which must stay at the starting weights while the policy trains."""
    reference = copy.deepcopy(model)
    reference.eval()
    reference.requires_grad_(False)
    return reference


def _trainable(
    model: torch.nn.Module, lora: LoraSettings | None, *, gradient_checkpointing: bool
) -> torch.nn.Module:
    """The model to train: with gradient checkpointing switched on when asked, then wrapped in
    a fresh LoRA adapter (base frozen) when ``lora`` is given; bad target modules are a
    UserError."""
    if gradient_checkpointing:
        # Non-reentrant checkpointing needs no input that requires grad, which LoRA lacks (the
        # embeddings are frozen).
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:  # transformers >= 5.x name
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(  # type: ignore[operator]
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
    if lora is None:
        return model
    from peft import LoraConfig, get_peft_model

    peft_config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # annotated int; any scale works
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, peft_config)
    except ValueError as exc:
        raise UserError(f"LoRA target_modules {lora.target_modules!r}: {exc}") from exc


def _set_compute(
    model: torch.nn.Module, reference: torch.nn.Module | None, cpu_matmul: CpuMatmul, *, bf16: bool
) -> None:
    """Give the policy and its frozen copy (if any) the same linear layers' library and compute
    dtype, so that reference log-probs are computed as the policy's are; then the policy's
    attention its float32 backward, after the dtype mark that
    :func:`use_float32_attention_backward` reads (only the policy runs a backward)."""
    for module in (model, reference):
        if module is not None:
            use_onednn_linears(module, cpu_matmul)
            set_compute_dtype(module, torch.bfloat16 if bf16 else None)
    use_float32_attention_backward(model)


_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""Where model configs state their context length (Llama/Qwen/Mistral, GPT-2, others)."""


_UNSET_LENGTH = 10**8
"""transformers sets model_max_length to a huge number (1e30) when a tokenizer states none."""


def model_context(config: Any, tokenizer: Any = None) -> tuple[int, str] | None:
    """The model's context length in tokens and where it was read: the config's
    max_position_embeddings (or its other names), else the tokenizer's model_max_length; None
    when neither states one."""
    key = next((k for k in _CONTEXT_KEYS if isinstance(getattr(config, k, None), int)), None)
    if key is not None:
        return int(getattr(config, key)), f"{key} in its config.json"
    length = getattr(tokenizer, "model_max_length", None)
    if isinstance(length, int) and 0 < length < _UNSET_LENGTH:
        return length, "model_max_length in its tokenizer_config.json"
    return None


def check_context_length(
    name_or_path: str, *, max_prompt_length: int | None, max_completion_length: int
) -> None:
    """Fail before any weights load or cache is allocated when a prompt of max_prompt_length
    tokens and a completion of max_completion_length cannot fit the model's context.

    Reads only the model's config.json. Models whose config states no context length pass.
    """
    from transformers import AutoConfig

    resolved = resolve_model_path(name_or_path)
    try:
        config = AutoConfig.from_pretrained(resolved)
    except (OSError, ValueError) as exc:
        raise hub_error(name_or_path, exc) from exc
    found = model_context(config)
    if found is None:
        return
    context, key = found
    prompt = max_prompt_length or 0
    if prompt + max_completion_length <= context:
        return
    if max_prompt_length is None:
        need = f"training.max_completion_length ({max_completion_length})"
    else:
        need = (
            f"training.max_prompt_length + max_completion_length ({max_prompt_length} + "
            f"{max_completion_length} = {prompt + max_completion_length})"
        )
    fix = (
        f"set max_completion_length to at most {context - prompt}"
        if context > prompt
        else f"set max_prompt_length below {context}"
    )
    raise UserError(
        f"{need} tokens do not fit the context of model '{name_or_path}' ({context} tokens, "
        f"{key}); {fix}"
    )
