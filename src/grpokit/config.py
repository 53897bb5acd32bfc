"""The YAML config: pydantic models with help text, loading with line numbers in errors.

Field names under `training:` follow TRL's GRPOConfig where the meaning is the same, so a TRL
user's settings carry over one to one (recipes/business-ideas/config.yaml holds the seed
article's GRPOConfig).
Batch arithmetic follows TRL too: `per_device_train_batch_size` counts completions, and one
generation batch of `per_device_train_batch_size * world_size * gradient_accumulation_steps`
completions (= prompts_per_step * num_generations) feeds one optimizer step per iteration.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from grpokit.errors import UserError
from grpokit.monitor.config import MonitorConfig
from grpokit.rewards.spec import RewardSpec, validate_reward_specs

EMBEDDED_MODEL = "smollm2-135m-instruct"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


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
            "float32 elsewhere (other CPUs, GPUs). training.bf16: true selects bfloat16 weights "
            "as in TRL."
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
        "auto", description="'auto' (cuda if available, else cpu), 'cpu', 'cuda:0'."
    )
    cpu_matmul: Literal["auto", "onednn", "torch"] = Field(
        "auto",
        description=(
            "Library for float32 linear layers on CPU: 'onednn' runs them (forward, backward, "
            "and decoding with prepacked weights) through oneDNN, several times faster than "
            "PyTorch's default MKL path on some CPUs (bench/rollout.py, bench/train_step.py "
            "measure it); 'auto' uses it when the PyTorch build has oneDNN; 'torch' keeps "
            "PyTorch's default. No effect on GPU or in 16-bit dtypes."
        ),
    )


class DataConfig(_Strict):
    train: str = Field(
        description="Training prompts: a .jsonl or .csv file, or a `datasets` save_to_disk directory."
    )
    heldout: str | None = Field(
        None, description="Held-out prompts for eval (never trained on); same formats as `train`."
    )
    prompt_column: str = Field(
        "prompt", description="Column with the prompt: a string or a list of chat messages."
    )
    system_prompt: str | None = Field(None, description="System prompt added to every prompt.")
    system_prompt_file: str | None = Field(
        None, description="File with the system prompt (relative to the config file)."
    )
    shuffle: bool = Field(True, description="Shuffle the prompts each epoch (seeded).")

    @model_validator(mode="after")
    def _one_system_prompt(self) -> DataConfig:
        if self.system_prompt is not None and self.system_prompt_file is not None:
            raise ValueError("set either system_prompt or system_prompt_file, not both")
        return self


_FSDP_OPTIONS = ("full_shard", "shard_grad_op", "offload", "auto_wrap")


def _legacy_fsdp(value: str) -> dict[str, bool]:
    """transformers' legacy ``fsdp`` string ("full_shard offload", ...) as fsdp_config settings,
    translated the way TrainingArguments translates it for FSDP2."""
    items = value.split()
    unknown = [x for x in items if x not in _FSDP_OPTIONS]
    if unknown:
        raise ValueError(
            f"unknown FSDP option {unknown[0]!r}: use true, or transformers' options "
            f"{', '.join(_FSDP_OPTIONS)} (space-separated)"
        )
    if "full_shard" in items and "shard_grad_op" in items:
        raise ValueError("choose one of full_shard and shard_grad_op")
    settings: dict[str, bool] = {}
    if "full_shard" in items or "shard_grad_op" in items:
        settings["reshard_after_forward"] = "full_shard" in items
    if "offload" in items:
        settings["cpu_offload"] = True
    return settings  # auto_wrap: decoder layers are always wrapped one by one


class FSDPConfig(_Strict):
    """transformers' ``fsdp_config`` keys for FSDP2 that grpokit implements."""

    version: Literal[2] = Field(
        2, description="FSDP version: 2 (torch's fully_shard), the only one grpokit implements."
    )
    reshard_after_forward: bool = Field(
        True,
        description=(
            "Free each layer's gathered weights after its forward and gather them again for its "
            "backward (transformers' full_shard: least memory). false keeps them from forward to "
            "backward (shard_grad_op: one all-gather less per layer, a full layer more memory)."
        ),
    )
    cpu_offload: bool = Field(
        False,
        description=(
            "Keep the sharded weights, gradients and optimizer state in CPU memory and run the "
            "optimizer step on the CPU: less GPU memory, slower steps. No effect on a CPU run."
        ),
    )
    transformer_layer_cls_to_wrap: list[str] | None = Field(
        None,
        description=(
            "Class names of the layers sharded one by one (each gathered only while it runs); "
            "default the model's own decoder layer classes (transformers' _no_split_modules, "
            "e.g. LlamaDecoderLayer)."
        ),
    )


class TrainingConfig(_Strict):
    output_dir: str | None = Field(
        None, description="Run directory; default runs/<config file name>."
    )
    seed: int = Field(42, description="Seed for data order, sampling and initialisation.")
    learning_rate: float = Field(1e-6, gt=0, description="AdamW peak learning rate.")
    num_train_epochs: float = Field(1.0, gt=0, description="Passes over the training prompts.")
    max_steps: int = Field(-1, description="Optimizer steps to run; overrides epochs when > 0.")
    per_device_train_batch_size: int = Field(
        8, ge=1, description="Completions per micro-batch (TRL's meaning)."
    )
    gradient_accumulation_steps: int = Field(
        1, ge=1, description="Micro-batches per optimizer step."
    )
    max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        description=(
            "Token budget of a micro-batch in the update (verl's ppo_max_token_len_per_gpu): "
            "consecutive completions are cut into micro-batches of at most "
            "per_device_train_batch_size rows whose padded size (rows x (longest prompt + "
            "longest completion)) stays within it; a longer single row goes alone. Bounds the "
            "update's memory when a few completions run long, and their padding. The update is "
            "the same for dapo, dr_grpo and grpo (normalised per step or per sequence); bnpo "
            "normalises per micro-batch by definition. null: rows only."
        ),
    )
    num_generations: int = Field(8, ge=2, description="Completions per prompt: the group size G.")
    num_iterations: int = Field(
        1, ge=1, description="Optimisation passes (mu) over each generation batch."
    )
    beta: float = Field(0.0, ge=0, description="KL coefficient towards the reference model.")
    epsilon: float = Field(0.2, ge=0, description="Lower clip range of the ratio.")
    epsilon_high: float | None = Field(
        None, ge=0, description="Upper clip range (DAPO clip-higher); default = epsilon."
    )
    delta: float | None = Field(
        None, description="Upper clamp of the ratio for negative advantages (two-sided clip)."
    )
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = Field(
        "dapo", description="Loss aggregation over tokens (see docs: math section 3)."
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Divide advantages by the group std, the batch std, or not at all."
    )
    advantage_estimator: Literal["grpo", "rloo"] = Field(
        "grpo", description="Baseline: group mean (GRPO) or leave-one-out mean (RLOO)."
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token", description="Per-token ratio, or one per sequence (GSPO)."
    )
    max_prompt_length: int | None = Field(
        512, ge=1, description="Prompts longer than this (in tokens) are truncated from the left."
    )
    max_completion_length: int = Field(256, ge=1, description="Maximum new tokens per completion.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold.")
    top_k: int | None = Field(0, ge=0, description="Top-k sampling; 0 or null disables it.")
    mask_truncated_completions: bool = Field(
        False, description="Exclude completions that hit max_completion_length from the loss."
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO dynamic sampling: drop groups with equal rewards and sample more prompts.",
    )
    max_dynamic_sampling_rounds: int = Field(
        3, ge=1, description="Generation rounds per step at most when dynamic_sampling is on."
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    lr_scheduler_type: Literal["constant", "constant_with_warmup", "linear", "cosine"] = Field(
        "linear", description="Learning-rate schedule after warm-up."
    )
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="Warm-up share of the total steps.")
    warmup_steps: int = Field(
        0, ge=0, description="Warm-up steps; overrides warmup_ratio when > 0."
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, description="AdamW beta1.")
    adam_beta2: float = Field(0.99, description="AdamW beta2.")
    adam_epsilon: float = Field(1e-8, description="AdamW epsilon.")
    bf16: bool = Field(False, description="Train in bfloat16 (sets model.dtype).")
    gradient_checkpointing: bool | None = Field(
        None, description="TRL's name for model.gradient_checkpointing."
    )
    logging_steps: int = Field(1, ge=1, description="Print a metrics line every N steps.")
    save_steps: int = Field(0, ge=0, description="Checkpoint every N steps; 0 = only at the end.")
    save_total_limit: int | None = Field(
        2, ge=1, description="Keep at most this many checkpoints (oldest deleted)."
    )
    log_completions: bool = Field(
        True, description="Write sampled completions to completions.jsonl."
    )
    log_completions_steps: int = Field(1, ge=1, description="Write completions every N steps.")
    num_completions_to_print: int = Field(
        8, ge=0, description="Completions written per logged step."
    )
    eval_steps: int = Field(
        0, ge=0, description="Evaluate on data.heldout every N steps (0 = off)."
    )
    eval_samples: int = Field(1, ge=1, description="Samples per held-out prompt in periodic eval.")
    eval_max_prompts: int = Field(16, ge=1, description="Held-out prompts used by periodic eval.")
    report_to: list[Literal["tensorboard", "wandb", "mlflow", "none"]] = Field(
        default_factory=lambda: ["tensorboard"], description="Metric sinks besides metrics.jsonl."
    )
    num_processes: int = Field(
        1, ge=1, description="Data-parallel processes (set by the launcher; 1 on a laptop)."
    )
    fsdp: bool = Field(
        False,
        description=(
            "Fully sharded data parallel (FSDP2): each process holds 1/N of the weights, "
            "gradients and optimizer state, for models that do not fit one device; launch 2+ "
            "processes (grpokit train --nproc N, torchrun, accelerate launch). A single process "
            "ignores it and says so. transformers' legacy strings ('full_shard', 'shard_grad_op', "
            "'offload', 'auto_wrap', space-separated) are accepted and set fsdp_config."
        ),
    )
    fsdp_config: FSDPConfig = Field(
        default_factory=FSDPConfig, description="FSDP settings (transformers' fsdp_config keys)."
    )
    use_vllm: bool = Field(
        False,
        description="Generate with vLLM (GPU only; pip install 'grpokit[vllm]') instead of torch.",
    )
    vllm_mode: Literal["colocate", "server"] = Field(
        "colocate",
        description=(
            "colocate: vLLM shares the training GPU, weights copied after every optimizer step; "
            "server: a separate `trl vllm-serve` on its own GPU, weights sent over NCCL."
        ),
    )
    vllm_gpu_memory_utilization: float = Field(
        0.3, gt=0, le=1, description="Share of the GPU vLLM may take in colocate mode."
    )
    vllm_server_base_url: str = Field(
        "http://127.0.0.1:8000", description="Address of the vLLM server (server mode)."
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy_values(cls, data: Any) -> Any:
        # TRL accepted scale_rewards: true/false before it took a string.
        if isinstance(data, dict) and isinstance(data.get("scale_rewards"), bool):
            data = dict(data)
            data["scale_rewards"] = "group" if data["scale_rewards"] else "none"
        # transformers' legacy fsdp strings; an explicit fsdp_config key wins, as in transformers.
        # An invalid string is left for the fsdp field's own check, which names its line.
        if isinstance(data, dict) and isinstance(data.get("fsdp"), str):
            try:
                settings = _legacy_fsdp(data["fsdp"])
            except ValueError:
                return data
            data = dict(data)
            explicit = data.get("fsdp_config")
            data["fsdp_config"] = (
                settings | explicit if isinstance(explicit, dict) else explicit or settings
            )
            data["fsdp"] = bool(data["fsdp"].split())
        return data

    @field_validator("fsdp", mode="before")
    @classmethod
    def _fsdp_option(cls, value: Any) -> Any:
        if isinstance(value, str):
            _legacy_fsdp(value)  # raises the reason it was not translated
        return value

    @model_validator(mode="after")
    def _batch_arithmetic(self) -> TrainingConfig:
        gen = self.generation_batch_size
        if gen % self.num_generations:
            raise ValueError(
                f"the generation batch per_device_train_batch_size x num_processes x "
                f"gradient_accumulation_steps = {self.per_device_train_batch_size} x "
                f"{self.num_processes} x {self.gradient_accumulation_steps} = {gen} completions is "
                f"not divisible by num_generations = {self.num_generations}; make it a multiple, "
                f"e.g. gradient_accumulation_steps: "
                f"{_fix_accumulation(self.per_device_train_batch_size * self.num_processes, self.num_generations)}"
            )
        eps_high = self.epsilon if self.epsilon_high is None else self.epsilon_high
        if self.delta is not None and self.delta <= 1 + eps_high:
            raise ValueError(f"delta ({self.delta}) must be greater than 1 + epsilon_high")
        if self.fsdp and self.use_vllm:
            raise ValueError(
                "fsdp and use_vllm cannot be combined: vLLM keeps a whole copy of the weights on "
                "each GPU and its weight sync reads whole parameters, which FSDP shards; generate "
                "with torch (use_vllm: false) under fsdp"
            )
        return self

    @property
    def generation_batch_size(self) -> int:
        """Completions generated per optimizer step (all processes)."""
        return (
            self.per_device_train_batch_size * self.num_processes * self.gradient_accumulation_steps
        )

    @property
    def prompts_per_step(self) -> int:
        return self.generation_batch_size // self.num_generations


def _fix_accumulation(per_step: int, group: int) -> int:
    for k in range(1, group + 1):
        if (per_step * k) % group == 0:
            return k
    return group


class GRPOKitConfig(_Strict):
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy model.")
    data: DataConfig = Field(description="Prompt sets and the system prompt.")
    rewards: list[RewardSpec] = Field(
        min_length=1, description="Reward functions, their weights and gates."
    )
    training: TrainingConfig = Field(
        default_factory=TrainingConfig, description="GRPO hyperparameters (TRL's names)."
    )
    monitors: MonitorConfig = Field(
        default_factory=MonitorConfig, description="Reward-hacking monitors and thresholds."
    )
    _config_dir: Path = PrivateAttr(default_factory=Path.cwd)
    _config_path: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _cross_checks(self) -> GRPOKitConfig:
        validate_reward_specs(self.rewards)
        if self.training.bf16:
            self.model.dtype = "bfloat16"
        if self.training.gradient_checkpointing is not None:
            self.model.gradient_checkpointing = self.training.gradient_checkpointing
        return self

    @property
    def config_dir(self) -> Path:
        """Directory that relative paths in the config resolve against."""
        return self._config_dir

    @property
    def config_path(self) -> Path | None:
        return self._config_path

    def resolve(self, path: str | Path) -> Path:
        """A path from the config, relative to the config file's directory."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self._config_dir / p)

    @property
    def output_dir(self) -> Path:
        if self.training.output_dir:
            return self.resolve(self.training.output_dir)
        stem = self._config_path.stem if self._config_path else "run"
        return Path.cwd() / "runs" / stem

    @property
    def system_prompt(self) -> str | None:
        if self.data.system_prompt_file:
            path = self.resolve(self.data.system_prompt_file)
            if not path.is_file():
                raise UserError(f"data.system_prompt_file: {path} does not exist")
            return path.read_text(encoding="utf-8").strip()
        return self.data.system_prompt

    def to_yaml(self) -> str:
        return yaml.safe_dump(
            self.model_dump(mode="json", exclude_none=True), sort_keys=False, allow_unicode=True
        )


# ---- loading -----------------------------------------------------------------------------------


def _line_map(node: yaml.Node, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], int]:
    """Map each key path in a YAML document to its 1-based line, for error messages."""
    lines: dict[tuple[Any, ...], int] = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = (*path, key.value)
            lines[sub] = key.start_mark.line + 1
            lines.update({k: v for k, v in _line_map(value, sub).items() if k != sub})
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_line_map(item, (*path, i)))
    return lines


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise UserError(f"--set {item!r}: expected key=value, e.g. --set training.beta=0.04")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def _apply_override(data: dict[str, Any], keys: list[str], value: Any) -> None:
    node: Any = data
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
    if isinstance(node, list):
        node[int(keys[-1])] = value
    else:
        node[keys[-1]] = value


def _field_names_at(loc: tuple[Any, ...]) -> list[str]:
    """Field names of the config section at `loc` (e.g. ("training",)), for spelling hints."""
    model: type[BaseModel] = GRPOKitConfig
    for key in loc:
        field = model.model_fields.get(str(key))
        if field is None:
            continue  # a list index
        nested = [
            a
            for a in (*getattr(field.annotation, "__args__", ()), field.annotation)
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if not nested:
            break
        model = nested[0]
    return list(model.model_fields)


def format_validation_error(
    err: ValidationError, source: str, lines: dict[tuple[Any, ...], int]
) -> str:
    """One readable message per problem: file:line, the field path, what is wrong."""
    out = [f"{source}: invalid config"]
    for e in err.errors():
        loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        # pydantic puts the union/model tag in the location; keep only real keys for the line.
        line = None
        for n in range(len(loc), -1, -1):
            if loc[:n] in lines:
                line = lines[loc[:n]]
                break
        where = ".".join(str(x) for x in loc) or "(top level)"
        prefix = f"  line {line}: " if line else "  "
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
            close = difflib.get_close_matches(str(loc[-1]), _field_names_at(loc[:-1]), n=1)
            msg += f"; did you mean {close[0]!r}?" if close else "; check the spelling"
        out.append(f"{prefix}{where}: {msg}")
    return "\n".join(out)


def load_config(path: str | Path, overrides: list[str] | None = None) -> GRPOKitConfig:
    """Read and validate a YAML config; errors become one UserError naming file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise UserError(f"{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping with model:, data:, rewards:, training:")
    lines = _line_map(node) if node is not None else {}
    for item in overrides or []:
        keys, value = _parse_override(item)
        try:
            _apply_override(data, keys, value)
        except (IndexError, ValueError, TypeError):
            raise UserError(f"--set {item!r}: no such place in the config") from None
    try:
        cfg = GRPOKitConfig.model_validate(data)
    except ValidationError as e:
        raise UserError(format_validation_error(e, str(path), lines)) from None
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
    cfg._config_dir = path.resolve().parent
    cfg._config_path = path.resolve()
    return cfg
