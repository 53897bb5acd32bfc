"""TRL's GRPOConfig fields that grpokit does not implement, with the reason and what to use.

Every field of TRL's ``GRPOConfig`` (TRL 1.16, with transformers' TrainingArguments) is one of:

- implemented: a field of ``training:`` with TRL's name, meaning and default (the few defaults
  grpokit sets differently are in :data:`DEFAULT_DIFFERS`, each with its reason);
- ignored: accepted with any value, because it changes nothing in grpokit's result (data-loader
  workers, console verbosity, launcher variables);
- refused: accepted only at a value that matches what grpokit does (TRL's default, as a whole
  ``GRPOConfig`` dump has it); any other value stops the config with the reason and what to use
  instead.

The table is data: config loading reads it (grpokit.config), ``docs/trl.md`` is generated from
it (grpokit.config_docs), and a test checks it against the installed TRL field by field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["ignored", "refused"]


@dataclass(frozen=True)
class TrlField:
    """A TRL field that is not a grpokit field."""

    name: str
    default: Any
    """TRL's default."""
    status: Status
    reason: str
    instead: str = ""
    accepted: tuple[Any, ...] | None = None
    """Values accepted (without effect) when refused; default: TRL's default alone."""

    def accepts(self, value: Any) -> bool:
        if self.status == "ignored":
            return True
        values = (self.default,) if self.accepted is None else self.accepted
        # true is not 1 here: a switch and a number are different settings.
        return any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in values)

    def refusal(self) -> str:
        """The message for a value this field does not accept."""
        values = (self.default,) if self.accepted is None else self.accepted
        shown = " or ".join(_yaml(v) for v in values)
        instead = f"; instead: {self.instead}" if self.instead else ""
        return (
            f"TRL's {self.name} is not supported ({self.reason}){instead}; accepted value: {shown}"
        )


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _group(
    status: Status,
    reason: str,
    instead: str = "",
    accepted: tuple[Any, ...] | None = None,
    **defaults: Any,
) -> list[TrlField]:
    return [TrlField(n, d, status, reason, instead, accepted) for n, d in defaults.items()]


_DEEPSPEED = "DeepSpeed is not used by grpokit"
_SHARD = "training.fsdp: true (FSDP2) shards weights, gradients and optimizer state"
_HUB = "grpokit does not upload to the Hugging Face Hub"
_UPLOAD = "upload a checkpoint directory with `hf upload`, or `grpokit export` it first"
_NO_EVAL_LOOP = "grpokit's periodic eval samples the held-out prompts; it has no Trainer eval loop"
_EVAL = "training.eval_steps, eval_samples, eval_max_prompts, and `grpokit eval` afterwards"
_COMPILE = "grpokit does not compile the model; its CPU decoder and oneDNN path are its speed-ups"
_VLLM = "grpokit's vLLM engine (training.use_vllm) does not take this setting; vLLM's own default applies"
_LOSS = "this loss variant is not implemented"
_LOSSES = "loss_type grpo, bnpo, dr_grpo, dapo, cispo or sapo; epsilon_high for clip-higher"
_LOADER = "prompts are held in memory; there is no data loader"
_TRACKIO = "grpokit reports to tensorboard, wandb and mlflow, not trackio"

TRL_FIELDS: dict[str, TrlField] = {
    f.name: f
    for f in [
        # ---- model loading
        *_group(
            "refused",
            "grpokit loads the model itself from model.name_or_path",
            "model.dtype for the weights' dtype; a local directory for a model revision",
            model_init_kwargs=None,
        ),
        *_group(
            "refused",
            "models that run code from their repository are not loaded",
            "a model transformers supports without remote code",
            trust_remote_code=False,
        ),
        *_group(
            "refused",
            "Mixture-of-Experts auxiliary losses are not implemented",
            router_aux_loss_coef=None,
        ),
        *_group(
            "refused",
            "grpokit leaves dropout as the model has it (causal LMs mostly have none)",
            "model.lora.dropout for the LoRA branch",
            disable_dropout=False,
        ),
        *_group(
            "refused",
            "grpokit trains in the weights' dtype (float32, or bfloat16 with bf16: true), "
            "without mixed-precision autocast or loss scaling",
            "training.bf16: true, or model.dtype",
            fp16=False,
            bf16_full_eval=False,
            fp16_full_eval=False,
            tf32=None,
        ),
        *_group(
            "refused",
            "gradient checkpointing takes no settings; it is always non-reentrant",
            "training.gradient_checkpointing: true",
            accepted=(None, {"use_reentrant": False}),
            gradient_checkpointing_kwargs=None,
            activation_checkpointing_kwargs=None,
        ),
        *_group(
            "refused",
            _COMPILE,
            torch_compile=False,
            torch_compile_backend=None,
            torch_compile_mode=None,
            use_liger_kernel=False,
            liger_kernel_config=None,
        ),
        *_group(
            "refused",
            "the training forward never uses a KV cache; generation has its own",
            use_cache=False,
            cache_implementation=None,
        ),
        *_group(
            "refused",
            "a supervised fine-tuning setting with no meaning in GRPO",
            "`grpokit sft` for supervised warm-starts",
            label_smoothing_factor=0.0,
            neftune_noise_alpha=None,
            label_names=None,
        ),
        # ---- data
        *_group(
            "refused",
            "every column reaches the reward functions (TRL's remove_unused_columns: false)",
            remove_unused_columns=False,
        ),
        *_group(
            "refused",
            "the prompt order is data.shuffle's (seeded, resumable)",
            "data.shuffle",
            shuffle_dataset=True,
        ),
        *_group(
            "refused",
            "prompts are shuffled with training.seed",
            "training.seed and data.shuffle",
            data_seed=None,
            train_sampling_strategy="random",
            length_column_name="length",
        ),
        *_group(
            "refused",
            "prompts are not padded to a multiple of a length",
            accepted=("auto", None),
            pad_to_multiple_of="auto",
        ),
        *_group(
            "ignored",
            _LOADER,
            dataloader_drop_last=False,
            dataloader_num_workers=0,
            dataloader_pin_memory=True,
            dataloader_persistent_workers=False,
            dataloader_prefetch_factor=None,
            dataloader_multiprocessing_context=None,
            dataloader_in_order=True,
        ),
        # ---- generation and batches
        *_group(
            "refused",
            "the periodic held-out eval samples eval_samples completions per prompt",
            "training.eval_samples",
            num_generations_eval=None,
        ),
        *_group("refused", "multimodal prompts are not implemented", log_multimodal=True),
        *_group(
            "refused",
            "generation runs on grpokit's torch engine or vLLM",
            "training.use_vllm",
            use_transformers_continuous_batching=False,
            transformers_continuous_batching_config=None,
            use_transformers_paged=False,
        ),
        *_group(
            "refused",
            _VLLM,
            vllm_model_impl="vllm",
            vllm_structured_outputs_regex=None,
            vllm_max_model_length=None,
            vllm_tensor_parallel_size=1,
            vllm_server_timeout=240.0,
            vllm_group_port=51216,
        ),
        *_group(
            "refused",
            _VLLM,
            "training.vllm_server_base_url: http://HOST:PORT",
            vllm_server_host="0.0.0.0",
            vllm_server_port=8000,
        ),
        *_group(
            "refused",
            "TRL's older name for vllm_importance_sampling_clip_max",
            "training.vllm_importance_sampling_clip_max",
            vllm_importance_sampling_cap=None,
        ),
        # ---- loss
        *_group(
            "refused",
            _LOSS,
            _LOSSES,
            vespo_k_pos=2.0,
            vespo_lambda_pos=3.0,
            vespo_k_neg=3.0,
            vespo_lambda_neg=2.0,
        ),
        *_group(
            "refused",
            "the reference model is the policy at the start of training and stays fixed",
            "model.init_from to start from (and refer to) a later checkpoint",
            sync_ref_model=False,
            ref_model_mixup_alpha=0.6,
            ref_model_sync_steps=512,
        ),
        *_group(
            "refused",
            "the token-level losses are normalised over the whole batch across processes",
            average_tokens_across_devices=True,
        ),
        # ---- optimisation
        *_group(
            "refused",
            "the schedules take no extra arguments",
            "lr_scheduler_type linear, cosine, constant or constant_with_warmup",
            lr_scheduler_kwargs=None,
        ),
        *_group(
            "refused",
            "only AdamW is implemented",
            "training.optim and the adam_* settings",
            optim_args=None,
            optim_target_modules=None,
        ),
        *_group(
            "refused",
            "the batch must hold whole groups, so it is not shrunk on out-of-memory (TRL "
            "refuses it too)",
            "a smaller per_device_train_batch_size, or max_tokens_per_micro_batch",
            auto_find_batch_size=False,
        ),
        *_group(
            "refused",
            "grpokit does not empty the device cache during training",
            torch_empty_cache_steps=None,
        ),
        *_group(
            "refused",
            "runs are seeded (training.seed) without forcing deterministic kernels",
            full_determinism=False,
        ),
        # ---- logging
        *_group(
            "refused",
            "metrics are written every step to metrics.jsonl; logging_steps sets the rest",
            "training.logging_steps",
            logging_strategy="steps",
            logging_first_step=False,
            include_num_input_tokens_seen="no",
        ),
        *_group(
            "refused",
            "only the main process writes metrics, completions and checkpoints",
            log_on_each_node=True,
            save_on_each_node=False,
        ),
        *_group(
            "ignored",
            "the console and progress bar are grpokit's own (`train --no-progress`)",
            log_level="passive",
            log_level_replica="warning",
            disable_tqdm=None,
            logging_nan_inf_filter=True,
            skip_memory_metrics=True,
        ),
        *_group(
            "refused",
            "runs are named by their output directory",
            "training.output_dir",
            run_name=None,
        ),
        *_group(
            "refused",
            _TRACKIO,
            "training.report_to",
            project="huggingface",
            trackio_space_id=None,
            trackio_bucket_id=None,
            trackio_static_space_id=None,
        ),
        *_group(
            "refused",
            "completions go to completions.jsonl in the run directory",
            "training.log_completions",
            log_unique_prompts=False,
            log_completions_hub_repo=None,
        ),
        *_group(
            "refused",
            "a debugging switch of transformers' Trainer",
            debug="",
        ),
        # ---- evaluation
        *_group(
            "refused",
            _NO_EVAL_LOOP,
            _EVAL,
            eval_delay=0,
            per_device_eval_batch_size=8,
            prediction_loss_only=False,
            eval_on_start=False,
            eval_do_concat_batches=True,
            eval_use_gather_object=False,
            eval_accumulation_steps=None,
            include_for_metrics=[],
            batch_eval_metrics=False,
        ),
        # ---- checkpointing
        *_group(
            "refused",
            "checkpoints hold the optimizer and random state, so that a run resumes exactly",
            "`grpokit export CHECKPOINT` for the weights alone",
            save_only_model=False,
        ),
        *_group(
            "refused",
            "Ctrl-C (SIGINT) saves a checkpoint; other signals do not",
            enable_jit_checkpoint=False,
        ),
        *_group(
            "refused",
            "a run directory resumes from its latest checkpoint with its own data order",
            "`grpokit train RUN_DIR`",
            resume_from_checkpoint=None,
            ignore_data_skip=False,
            restore_callback_states_from_checkpoint=False,
        ),
        *_group(
            "refused",
            _HUB,
            _UPLOAD,
            push_to_hub=False,
        ),
        *_group(
            "ignored",
            f"used only with push_to_hub, which is refused ({_HUB})",
            hub_token=None,
            hub_private_repo=None,
            hub_model_id=None,
            hub_strategy="every_save",
            hub_always_push=False,
            hub_revision=None,
        ),
        # ---- distribution
        *_group(
            "refused",
            _DEEPSPEED,
            _SHARD,
            deepspeed=None,
            ds3_gather_for_generation=True,
        ),
        *_group(
            "refused",
            "processes come from the launcher (grpokit train --nproc, torchrun, accelerate "
            "launch); device placement is model.device",
            "model.device, and --nproc",
            use_cpu=False,
            accelerator_config=None,
            parallelism_config=None,
            ddp_backend=None,
        ),
        *_group(
            "ignored",
            "grpokit sums gradients across processes itself, without DistributedDataParallel",
            ddp_find_unused_parameters=None,
            ddp_bucket_cap_mb=None,
            ddp_broadcast_buffers=None,
            ddp_static_graph=None,
            ddp_timeout=1800,
        ),
        *_group(
            "ignored",
            "set by the launcher or used by training scripts, not by the trainer",
            local_rank=-1,
            do_train=False,
            do_eval=False,
            do_predict=False,
        ),
    ]
}

DEFAULT_DIFFERS: dict[str, str] = {
    "bf16": "TRL trains in bfloat16 unless fp16 is set; grpokit in float32, which CPUs run "
    "faster and which every device supports. Set bf16: true on a GPU.",
    "gradient_checkpointing": "TRL turns it on; grpokit leaves it off (model.gradient_checkpointing): "
    "small models on CPU gain nothing from it and run slower. Turn it on for large models.",
    "report_to": "TRL reports nowhere by default; grpokit writes TensorBoard beside metrics.jsonl, "
    "locally and without an account. 'none' turns it off.",
    "log_completions": "grpokit's report and reward-hacking monitors read completions.jsonl; TRL "
    "only prints samples when asked.",
    "num_completions_to_print": "completions.jsonl gets 8 per logged step rather than every "
    "completion of the batch (TRL's null), so it stays small on long runs; give a number.",
    "vllm_server_base_url": "TRL builds the address from vllm_server_host and port (0.0.0.0:8000); "
    "grpokit takes the address itself, 127.0.0.1:8000 by default.",
}
"""grpokit fields with TRL's name and meaning whose default differs from TRL's, and why."""

GRPOKIT_ONLY: dict[str, str] = {
    "max_prompt_length": "TRL had it before 1.x (prompts truncated from the left)",
    "warmup_ratio": "transformers had it before 5.x (now warmup_steps below 1)",
    "advantage_estimator": "RLOO's leave-one-out baseline",
    "dynamic_sampling": "DAPO's dynamic sampling",
    "max_dynamic_sampling_rounds": "DAPO's dynamic sampling",
    "curriculum": "prime-rl's difficulty pools: prompts whose groups were flat drawn less often",
    "max_tokens_per_micro_batch": "verl's token budget per micro-batch",
    "logprob_chunk_size": "log-probs a chunk of positions at a time, without the whole logits",
    "padding_free": "TRL's SFTConfig has it (GRPOConfig does not): sequences packed without padding",
    "ref_logprobs_in_rollout": "LoRA's reference log-probs scored as the rollout decodes, not in "
    "a forward of their own",
    "log_completions_steps": "how often completions.jsonl is written",
    "eval_samples": "the periodic held-out eval",
    "eval_max_prompts": "the periodic held-out eval",
    "num_processes": "set by the launcher",
    "save_minutes": "a checkpoint by time as well as by steps, so a crash loses little",
    "max_nonfinite_steps": "how many NaN steps in a row are skipped before the run stops",
    "early_stopping_patience": "transformers' EarlyStoppingCallback argument: evals without "
    "improvement before the run stops",
    "early_stopping_threshold": "transformers' EarlyStoppingCallback argument: the least "
    "improvement that counts",
    "tool_call_format": "how tool calls are read (TRL reads them with the tokenizer's response "
    "schema)",
    "tool_call_regex": "a pattern of your own for tool calls",
    "tool_call_lenient": "tool calls written outside the format (bare JSON, a json code block) "
    "run and counted",
    "tool_timeout": "a tool call's time limit",
    "tool_max_result_chars": "a tool result's length limit",
    "vllm_lora_sync": "a LoRA adapter synced to vLLM alone or merged into dense weights",
    "max_staleness": "TRL's AsyncGRPOConfig field (its separate async trainer): generation "
    "ahead of the update",
    "truncated_logprobs": "top-k / top-p: the trainer's ratios on the truncated sampling "
    "distribution the tokens were drawn from (TRL issue #6789; NeMo-RL, prime-rl do the same)",
}
"""training: fields that are not GRPOConfig's (older TRL names, and grpokit's own)."""

TRL_SCRIPT_KEYS: dict[str, str] = {
    "model_name_or_path": "model.name_or_path",
    "dataset_name": "data.train (a hub name, or {path: ..., name: ..., split: ...})",
    "dataset_config": "data.train: {path: ..., name: CONFIG}",
    "dataset_train_split": "data.train: {path: ..., split: SPLIT}",
    "dataset_test_split": "data.heldout: {path: ..., split: SPLIT}",
    "torch_dtype": "model.dtype",
    "dtype": "model.dtype",
    "use_peft": "model.lora: {r: 16}",
    "lora_r": "model.lora.r",
    "lora_alpha": "model.lora.alpha",
    "lora_dropout": "model.lora.dropout",
    "lora_target_modules": "model.lora.target_modules",
    "reward_funcs": "rewards: (a list of {type: ...}; `type: python` for your own function)",
    "system_prompt": "data.system_prompt",
    "tools": "tools: at the top of the config (a list of file.py:function)",
    "environment_factory": "environment_factory: at the top of the config (file.py:Class)",
}
"""Keys of a flat `trl grpo --config` YAML (TRL's script and model arguments) and where they go."""


TRL_TOOL_API: dict[str, tuple[str, str, str]] = {
    "tools": (
        "GRPOTrainer(tools=...)",
        "accepted",
        "`tools:` at the top of the config, `file.py:function` or `module:function` entries; sync "
        "or async; the JSON schema from the type hints and the Google-style docstring "
        "(transformers' get_json_schema, as TRL), passed to the chat template's `tools`. Each "
        "call runs in a thread of its own with training.tool_timeout; an exception, a timeout or "
        'bad arguments become the tool message {"error": ...}, and a result is cut at '
        "training.tool_max_result_chars. A tool that does not import or lacks hints or a "
        "docstring stops the run before the model loads (exit 2). grpokit's own addition: an "
        "entry {function: ..., sandbox: true} runs each call in the code sandbox.",
    ),
    "environment_factory": (
        "GRPOTrainer(environment_factory=...)",
        "accepted (one factory)",
        "`environment_factory:` at the top of the config, `file.py:Class` or `module:factory`: "
        "one instance per rollout, kept and reused; reset(**row) returns text appended to the "
        "prompt's last message, or None; the public methods are tools on that rollout's own "
        "instance; reward functions receive `environments=`. TRL's dict of several factories "
        "(picked by an `environment` column) is not taken.",
    ),
    "get_reward": (
        "environment method",
        "accepted",
        "read by the reward `{type: environment}`, listed in `rewards:` like any other (TRL "
        "adds it by itself, with weight 1).",
    ),
    "max_tool_calling_iterations": (
        "GRPOConfig",
        "accepted",
        "training.max_tool_calling_iterations: rounds of tool calls per completion; null: no "
        "limit but max_completion_length.",
    ),
    "max_completion_length": (
        "GRPOConfig",
        "accepted",
        "counts the tokens of all turns, tool messages included, as in TRL; a tool result that "
        "would leave no room is run but not appended, and the completion ends truncated.",
    ),
    "response_schema": (
        "tokenizer attribute",
        "not read",
        "TRL parses tool calls with the tokenizer's response schema; grpokit with "
        "training.tool_call_format (auto: from the chat template; hermes, llama3, or regex with "
        "training.tool_call_regex).",
    ),
    "chat template": (
        "tokenizer",
        "accepted",
        "must render `tools` and 'tool' messages (else exit 2 naming model.chat_template; "
        "`model.chat_template: hermes` gives one, `auto` the model's own where it shows tools "
        "and hermes where it does not). TRL swaps a template that re-renders earlier "
        "turns for a training template; grpokit never re-renders: the next turn's input is the "
        "previous input's ids, the sampled ids and the tool message's ids.",
    ),
    "tool metrics": (
        "logged",
        "accepted",
        "tools/call_frequency and tools/failure_frequency (TRL's names), with tools/<name>/calls, "
        "turns/mean and turns/max, and grpokit's tools/unparsed_frequency (calls written "
        "outside the format; run only with training.tool_call_lenient); tool tokens are masked "
        "out of the loss, the KL and the entropy.",
    ),
    "use_vllm": (
        "GRPOConfig",
        "accepted",
        "tools run with either engine: vLLM takes each turn's token ids and returns the sampled "
        "ids and log-probs; only rows that called a tool are sampled again.",
    ),
}
"""TRL's tool-calling API (GRPOTrainer arguments, GRPOConfig fields, the tokenizer): name ->
(where TRL has it, status in grpokit, what grpokit does)."""


def drop_accepted_trl_fields(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the TRL fields given at a value grpokit accepts (they change nothing);
    refused values stay, for the config's own check to report with their line."""
    return {k: v for k, v in data.items() if k not in TRL_FIELDS or not TRL_FIELDS[k].accepts(v)}
