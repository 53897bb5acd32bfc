"""The model: and data: sections of the config."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from grpokit.data.sources import DatasetSource
from grpokit.errors import UserError

EMBEDDED_MODEL = "smollm2-135m-instruct"
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


class _Strict(BaseModel):
    # Infinite and NaN numbers are refused everywhere: a learning rate of .inf validates, then
    # turns the weights to NaN at the first step.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LoraConfig(_Strict):
    r: int = Field(16, ge=1, description="LoRA rank.")
    alpha: float = Field(32.0, gt=0, description="LoRA alpha (scaling = alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA branch.")
    target_modules: list[str] | str = Field(
        "all-linear",
        description="Module names to adapt, or 'all-linear' for every linear layer but the head.",
    )


class ModelConfig(_Strict):
    name_or_path: str = Field(
        EMBEDDED_MODEL,
        description=(
            "A Hugging Face causal LM directory or hub name, or 'smollm2-135m-instruct' for the "
            "embedded default model (no download needed)."
        ),
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "float32",
        description=(
            "Weights dtype. 'auto': float32 weights and optimizer state, with bfloat16 compute "
            "(autocast in training, a bfloat16 copy of the weights for decoding) on a CPU that "
            "multiplies bfloat16 natively (AVX512-BF16 or AMX) when cpu_matmul is not 'torch'; "
            "under LoRA the frozen base layers are then stored in bfloat16, which every forward "
            "computed them in anyway (the trained adapters stay float32). float32 elsewhere "
            "(other CPUs, GPUs). training.bf16: true selects bfloat16 weights as in TRL."
        ),
    )
    lora: LoraConfig | None = Field(
        None, description="LoRA settings; omit (null) for full fine-tuning."
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass to save memory."
    )
    init_from: str | None = Field(
        None,
        description=(
            "A grpokit checkpoint (e.g. from `grpokit sft`) to start from. It also becomes the "
            "reference model for the KL penalty."
        ),
    )
    device: str = Field(
        "auto",
        description="'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:N' or 'mps'.",
    )
    cpu_matmul: Literal["auto", "onednn", "torch"] = Field(
        "auto",
        description=(
            "Library for float32 linear layers on CPU: 'onednn' runs them (forward, backward, "
            "and decoding with prepacked weights) through oneDNN, several times faster than "
            "PyTorch's default MKL path on some CPUs (bench/rollout.py, bench/train_step.py "
            "measure it); 'auto' uses it where the PyTorch build has oneDNN, for the training "
            "products only on CPUs with AVX-512 (on AVX2-only CPUs MKL's were faster), and "
            "decodes on AVX2-only CPUs with grpokit's own blocked float32 product, faster there "
            "than oneDNN's; 'torch' keeps PyTorch's default. No effect on GPU or in 16-bit "
            "dtypes."
        ),
    )
    return_freed_memory: bool = Field(
        False,
        description=(
            "On CPU under Linux's glibc, give freed blocks of 1 MiB and more back to the system "
            "at once (malloc's mmap threshold fixed at 1 MiB) instead of keeping them for reuse, "
            "so that the resident memory follows what a step holds. Measured at 8 completions "
            "of 1,024 tokens with a 128k vocabulary, gradient checkpointing and "
            "logprob_chunk_size 256: peak 4.48 -> 3.48 GiB (bench/memory.py). The price is page "
            "faults on every new large tensor: on the embedded model's short steps LoRA ran at "
            "the same speed, full fine-tuning, which allocates its gradients afresh each step, "
            "1.16-1.28x slower (two runs). Process-wide; left alone when MALLOC_MMAP_THRESHOLD_ is set. "
            "The rollout also packs LoRA's frozen base afresh each time instead of keeping its "
            "packed copy for the next rollout, so the update runs without it (on AVX2-only "
            "CPUs a float32 copy as large as the base)."
        ),
    )
    chat_template: str | None = Field(
        None,
        description=(
            "How prompts become text for a model whose tokenizer has no chat template (a base "
            "model): a Jinja chat template, inline or as a file path relative to the config, or "
            "'plain' for the messages' texts joined by blank lines with nothing added, or 'hermes' "
            "for ChatML with tool calls (<tool_call> tags, for `tools:`). Replaces "
            "the tokenizer's own template when set. 'auto' (for `tools:`): the model's own "
            "template where it shows tools (Qwen2.5, Llama 3.1: the call format the model was "
            "trained on), 'hermes' where a ChatML model's own does not (SmolLM2)."
        ),
    )

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError(
                f"{value!r} is not a device grpokit runs on; use auto, cpu, cuda, cuda:N or mps"
            )
        return value

    def check_device(self, option: str = "model.device") -> None:
        """Fail when the device names hardware this machine lacks; checked when a run starts
        (a config written for a GPU machine still loads elsewhere, e.g. for `grpokit eval`)."""
        import torch

        kind, _, index = self.device.partition(":")
        if kind == "cuda":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if count == 0:
                raise UserError(
                    f"{option} {self.device!r}: this machine has no CUDA device that PyTorch "
                    "can use; use auto or cpu"
                )
            if index and int(index) >= count:
                raise UserError(
                    f"{option} {self.device!r}: this machine has {count} CUDA device(s), "
                    f"cuda:0 to cuda:{count - 1}"
                )
        if kind == "mps" and not torch.backends.mps.is_available():
            raise UserError(
                f"{option} 'mps': Apple's Metal (MPS) is not available here; use auto or cpu"
            )


class DatasetSpec(_Strict):
    """A dataset as ``datasets.load_dataset`` takes it (TRL's dataset_name, dataset_config and
    dataset_train_split)."""

    path: str = Field(
        description="A local file (.jsonl, .json, .csv, .parquet, .arrow) or folder (of such "
        "files, or written by save_to_disk), relative to the config file; or a Hugging Face hub "
        "dataset name (owner/name)."
    )
    name: str | None = Field(None, description="The dataset's config name (load_dataset's name).")
    split: str = Field(
        "train",
        description="The split, with an optional slice as `datasets` writes it: train[:500], "
        "train[10%:], train+test.",
    )
    revision: str | None = Field(None, description="A hub branch, tag or commit.")
    data_files: str | list[str] | dict[str, str | list[str]] | None = Field(
        None, description="Files to read inside a folder or hub repository (glob patterns)."
    )


class DataConfig(_Strict):
    train: str | DatasetSpec = Field(
        description="Training prompts: a path or hub name as `datasets.load_dataset` takes it "
        "(.jsonl, .json, .csv, .parquet, .arrow, a folder of such files, a save_to_disk folder), "
        "or {path, name, split, revision, data_files}."
    )
    heldout: str | DatasetSpec | None = Field(
        None, description="Held-out prompts for eval (never trained on); same forms as `train`."
    )
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="Renames dataset columns to the names the prompt and rewards use, "
        "{dataset column: name}, e.g. {question: prompt, solution: answer}.",
    )
    prompt_column: str = Field(
        "prompt",
        description="Column with the prompt (after `columns`): a string or a list of chat "
        "messages.",
    )
    system_prompt: str | None = Field(None, description="System prompt added to every prompt.")
    system_prompt_file: str | None = Field(
        None, description="File with the system prompt (relative to the config file)."
    )
    shuffle: bool = Field(True, description="Shuffle the prompts each epoch (seeded).")
    drop_long_prompts: bool = Field(
        False,
        description="Without training.max_prompt_length, a prompt (with the chat template and "
        "system prompt) that leaves less than max_completion_length tokens of the model's "
        "context is refused, with its line; true drops such prompts instead and prints how many.",
    )

    @model_validator(mode="after")
    def _one_system_prompt(self) -> DataConfig:
        if self.system_prompt is not None and self.system_prompt_file is not None:
            raise ValueError("set either system_prompt or system_prompt_file, not both")
        return self

    def source(self, which: Literal["train", "heldout"]) -> DatasetSource:
        """The prompt set ``which`` as grpokit.data reads it (relative paths unresolved)."""
        spec = self.train if which == "train" else self.heldout
        if spec is None:
            raise UserError("data.heldout is not set; add held-out prompts to the config")
        if isinstance(spec, str):
            return DatasetSource(spec)
        return DatasetSource(**spec.model_dump())


class ToolSpec(_Strict):
    """A ``tools:`` entry written out, for a tool with settings of its own."""

    function: str = Field(
        description="`file.py:function` (relative to the config file) or `module:function`."
    )
    sandbox: bool = Field(
        False,
        description="Run each call in the code sandbox (docs/sandbox.md): a fresh confined "
        "subprocess without network, other processes or files outside its own directory, "
        "limited to training.tool_timeout and memory_mb. For tools that execute what the model "
        "wrote. The tool must be a top-level function of a self-contained .py file (or module) "
        "that needs only the standard library.",
    )
    memory_mb: int = Field(
        512, ge=32, description="With sandbox: true, the memory a call may use (MiB)."
    )
