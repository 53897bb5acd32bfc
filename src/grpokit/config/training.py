"""The training: section: TRL's GRPOConfig names, grouped (generation, loss, optimisation,
checkpointing, logging, distribution) for the help and the docs.

Batch arithmetic follows TRL: `per_device_train_batch_size` counts completions, an optimizer
step takes `per_device_train_batch_size * world_size * gradient_accumulation_steps` of them, and
one generation batch of `per_device_train_batch_size * world_size * steps_per_generation`
completions (= prompts_per_step * num_generations; steps_per_generation defaults to
gradient_accumulation_steps) feeds steps_per_generation / gradient_accumulation_steps optimizer
steps per iteration.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from grpokit.config.sections import _Strict
from grpokit.config.trl_forms import from_trl_forms, legacy_fsdp
from grpokit.core.names import LossTypeName, MismatchMode, MultiObjectiveAggregation
from grpokit.rollout.tool_calls import check_pattern

if TYPE_CHECKING:  # torch: imported where these are built, so a config validates without it
    from grpokit.core.curriculum import Curriculum
    from grpokit.core.entropy import EntropyControl
    from grpokit.core.losses import LossSettings
    from grpokit.rollout.base import SamplingParams


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


class CurriculumConfig(_Strict):
    """A pass-rate curriculum: prompts whose last group was flat (every completion scored the
    same) are drawn less often (docs/math.md, "Groups that all score the same")."""

    easy_threshold: float = Field(
        0.5,
        description="A prompt whose last group was flat is easy when that group's mean total "
        "reward is at least this (every completion right), hard below it (every completion "
        "wrong). The default suits rewards that are 0 when wrong and 1 or more when right.",
    )
    easy_keep_prob: float = Field(
        0.1,
        ge=0,
        le=1,
        description="The probability that an easy prompt is drawn when the prompt order reaches "
        "it; otherwise it is passed over until the next epoch, and the step takes the next "
        "prompt instead.",
    )
    hard_keep_prob: float = Field(
        0.1,
        ge=0,
        le=1,
        description="The same for a hard prompt. Other prompts (their last group had a spread, "
        "or none drawn yet) are always drawn.",
    )


# Groups of training: fields, for the help output and docs/trl.md (the names stay TRL's).
_GEN: JsonDict = {"group": "generation"}
_LOSS: JsonDict = {"group": "loss"}
_OPT: JsonDict = {"group": "optimisation"}
_CKPT: JsonDict = {"group": "checkpointing"}
_LOG: JsonDict = {"group": "logging"}
_DIST: JsonDict = {"group": "distribution"}
TRAINING_GROUPS = ("generation", "loss", "optimisation", "checkpointing", "logging", "distribution")

# Keys of generation_kwargs that grpokit's samplers honour (the sampling fields of this section).
GENERATION_KWARGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# apply_chat_template arguments grpokit sets itself.
_TEMPLATE_ARGS = ("conversation", "messages", "tokenize", "add_generation_prompt", "tools")
_8BIT_ADAMW = ("adamw_bnb_8bit", "adamw_8bit")


ReportTo = Literal["tensorboard", "wandb", "mlflow", "none"]


def _default_report_to() -> list[ReportTo]:
    return ["tensorboard"]


class TrainingConfig(_Strict):
    # ---- generation
    num_generations: int = Field(
        8, ge=2, description="Completions per prompt: the group size G.", json_schema_extra=_GEN
    )
    max_prompt_length: int | None = Field(
        512,
        ge=1,
        description="Prompts longer than this (in tokens) are truncated from the left; null keeps "
        "them whole, and one that leaves less than max_completion_length of the model's context "
        "is refused before training (or dropped: data.drop_long_prompts). TRL 1.x dropped this "
        "setting; older TRL configs have it.",
        json_schema_extra=_GEN,
    )
    max_completion_length: int = Field(
        512, ge=1, description="Maximum new tokens per completion.", json_schema_extra=_GEN
    )
    temperature: float = Field(
        1.0, gt=0, description="Sampling temperature.", json_schema_extra=_GEN
    )
    top_p: float = Field(
        1.0, gt=0, le=1, description="Nucleus sampling threshold.", json_schema_extra=_GEN
    )
    top_k: int | None = Field(
        0, ge=0, description="Top-k sampling; 0 or null disables it.", json_schema_extra=_GEN
    )
    min_p: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Minimum token probability, relative to the most likely token's (typical "
        "values 0.01-0.2); null disables it.",
        json_schema_extra=_GEN,
    )
    repetition_penalty: float = Field(
        1.0,
        gt=0,
        description="Penalty on tokens already in the prompt or completion: > 1 discourages "
        "repeating them, < 1 encourages it, 1 is off.",
        json_schema_extra=_GEN,
    )
    generation_kwargs: dict[str, Any] | None = Field(
        None,
        description="More sampling settings, overriding the fields above (TRL's precedence); "
        f"grpokit's samplers take {', '.join(GENERATION_KWARGS)}.",
        json_schema_extra=_GEN,
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        None,
        description="Variables for the tokenizer's chat template when prompts are encoded, "
        "e.g. {enable_thinking: false} for Qwen3.",
        json_schema_extra=_GEN,
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO dynamic sampling: drop groups with equal rewards and sample more prompts.",
        json_schema_extra=_GEN,
    )
    max_dynamic_sampling_rounds: int = Field(
        3,
        ge=1,
        description="Generation rounds per step at most when dynamic_sampling is on.",
        json_schema_extra=_GEN,
    )
    curriculum: CurriculumConfig | None = Field(
        None,
        description="A pass-rate curriculum (prime-rl's difficulty pools): each prompt's last "
        "group is recorded, and prompts whose group was flat, all right (easy) or all wrong "
        "(hard), are drawn less often, so a step keeps its prompts and more of them have a "
        "reward spread. The records are saved with each checkpoint. null: off; {} turns it on "
        "with its defaults. Logs curriculum/easy, /normal, /hard (prompts in each pool) and "
        "/passed_over. It acts from a prompt's second draw: a run that meets each prompt once "
        "is unchanged.",
        json_schema_extra=_GEN,
    )
    steps_per_generation: int | None = Field(
        None,
        ge=1,
        description="Micro-batches of per_device_train_batch_size completions (per process) "
        "generated at once: one generation batch of per_device_train_batch_size x processes x "
        "steps_per_generation completions feeds steps_per_generation / "
        "gradient_accumulation_steps optimizer steps (each on its own slice, in order; with "
        "num_iterations, that many passes over the slices), their old log-probs taken once after "
        "generation. null: gradient_accumulation_steps (one step per generation). A multiple of "
        "gradient_accumulation_steps; not with generation_batch_size.",
        json_schema_extra=_GEN,
    )
    generation_batch_size: int | None = Field(
        None,
        ge=1,
        description="Completions generated at once, all processes: steps_per_generation given "
        "as a batch size (a multiple of per_device_train_batch_size x processes x "
        "gradient_accumulation_steps and of num_generations). null: from steps_per_generation.",
        json_schema_extra=_GEN,
    )
    use_vllm: bool = Field(
        False,
        description=(
            "Generate with vLLM instead of torch: on a GPU (pip install 'grpokit[vllm]') or on "
            "CPU with vLLM's CPU build (scripts/setup.sh vllm); see docs/vllm.md."
        ),
        json_schema_extra=_GEN,
    )
    vllm_mode: Literal["colocate", "server"] = Field(
        "colocate",
        description=(
            "colocate: vLLM runs in the training process on its device (GPU or CPU), weights "
            "copied after every optimizer step; "
            "server: a separate `trl vllm-serve` on its own GPU, weights sent over NCCL (a "
            "trainer without a GPU: `grpokit vllm-serve`, weights sent as files)."
        ),
        json_schema_extra=_GEN,
    )
    vllm_gpu_memory_utilization: float = Field(
        0.3,
        gt=0,
        le=1,
        description=(
            "Colocate mode: on a GPU, the share of its memory vLLM may take; on CPU, the share "
            "of the free host memory its KV cache may take (no more than one generation batch "
            "needs)."
        ),
        json_schema_extra=_GEN,
    )
    vllm_lora_sync: Literal["adapter", "merged"] = Field(
        "merged",
        description=(
            "Under LoRA with vLLM colocated, what each weight sync sends: 'merged' dense weights "
            "(the adapter merged in; vLLM runs a plain model) or the 'adapter' alone, run by "
            "vLLM's LoRA support (the base weights sent once). Server mode sends dense weights. "
            "docs/vllm.md compares the two."
        ),
        json_schema_extra=_GEN,
    )
    vllm_enable_sleep_mode: bool = Field(
        False,
        description=(
            "Colocate mode on a GPU: vLLM sleeps between generations (its weights offloaded to "
            "host memory, its KV cache freed), so the update has that GPU memory; costs a copy "
            "back and forth per step. vLLM's CPU backend has no sleep mode."
        ),
        json_schema_extra=_GEN,
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description=(
            "0: each step generates, then trains (on-policy). N >= 1: with vllm_mode: server, "
            "generation runs up to N steps ahead of the update, overlapping it, so a step trains "
            "on completions sampled by weights at most N updates old (TRL's AsyncGRPOConfig "
            "name); the gap is corrected by vllm_importance_sampling_correction and logged as "
            "staleness."
        ),
        json_schema_extra=_GEN,
    )
    vllm_server_base_url: str = Field(
        "http://127.0.0.1:8000",
        description="Address of the vLLM server (server mode).",
        json_schema_extra=_GEN,
    )
    max_tool_calling_iterations: int | None = Field(
        None,
        ge=1,
        description="With `tools:`, rounds of tool calls per completion at most; null for no "
        "limit but max_completion_length, which counts the tokens of all turns, tool messages "
        "included.",
        json_schema_extra=_GEN,
    )
    tool_call_format: Literal["auto", "hermes", "llama3", "regex"] = Field(
        "auto",
        description="How tool calls are read from the model's turn: 'hermes' "
        '(<tool_call>{"name": ..., "arguments": ...}</tool_call>, Qwen and other ChatML '
        "templates), 'llama3' (the turn is {\"name\": ..., \"parameters\": ...}), 'regex' "
        "(tool_call_regex), or 'auto': the one the chat template uses.",
        json_schema_extra=_GEN,
    )
    tool_call_regex: str | None = Field(
        None,
        description="With tool_call_format: regex, a pattern with named groups (?P<name>...) and "
        "(?P<arguments>...) (a JSON object), or one group (?P<call>...) holding "
        '{"name": ..., "arguments": ...}.',
        json_schema_extra=_GEN,
    )
    tool_call_lenient: bool = Field(
        False,
        description="Also run the tool calls a model writes outside tool_call_format, in a turn "
        'where that format finds none: a JSON object {"name": <a configured tool>, '
        '"arguments": {...}}, bare or in a json code block (real instruct models do). Either '
        "way such calls are counted as tools/unparsed_frequency (calls per completion); off, "
        "they are not run, and training and preflight warn about them.",
        json_schema_extra=_GEN,
    )
    tool_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a tool call may run; a call still running then becomes the tool "
        'message {"error": ...}, as an exception does.',
        json_schema_extra=_GEN,
    )
    tool_max_result_chars: int = Field(
        2000,
        ge=1,
        description="Longest tool message in characters; a longer result is cut, with a note "
        "saying so.",
        json_schema_extra=_GEN,
    )

    # ---- loss
    beta: float = Field(
        0.0,
        ge=0,
        description="KL coefficient towards the reference model.",
        json_schema_extra=_LOSS,
    )
    epsilon: float = Field(
        0.2, ge=0, description="Lower clip range of the ratio.", json_schema_extra=_LOSS
    )
    epsilon_high: float | None = Field(
        None,
        ge=0,
        description="Upper clip range (DAPO clip-higher); default = epsilon.",
        json_schema_extra=_LOSS,
    )
    delta: float | None = Field(
        None,
        description="Upper clamp of the ratio for negative advantages (two-sided clip).",
        json_schema_extra=_LOSS,
    )
    vllm_importance_sampling_correction: bool = Field(
        True,
        description="Correct for the difference between the sampler's and the trainer's "
        "log-probabilities (vLLM computes with other kernels and often another dtype): each "
        "token's policy term is weighted by pi_trainer / pi_sampler, truncated or masked as "
        "vllm_importance_sampling_mode says. Applies to the vLLM engine; the gap is logged "
        "(mismatch/kl, mismatch/max_ratio) with every engine.",
        json_schema_extra=_LOSS,
    )
    vllm_importance_sampling_mode: MismatchMode = Field(
        "sequence_mask",
        description="token_truncate / token_mask: each token's own ratio, clipped to "
        "[clip_min, clip_max] or zeroed outside it; sequence_truncate / sequence_mask: the "
        "product of a completion's ratios for all its tokens.",
        json_schema_extra=_LOSS,
    )
    vllm_importance_sampling_clip_min: float | None = Field(
        None,
        ge=0,
        description="Lower bound of the mismatch ratio (null: 0, no lower bound).",
        json_schema_extra=_LOSS,
    )
    vllm_importance_sampling_clip_max: float = Field(
        3.0,
        gt=0,
        description="Upper bound of the mismatch ratio.",
        json_schema_extra=_LOSS,
    )
    truncated_logprobs: bool = Field(
        True,
        description="With top_p < 1 or top_k > 1, the trainer scores its current and old "
        "log-probs under the sampling distribution truncated by top-k / top-p and renormalised "
        "over the kept tokens, the distribution the tokens were drawn from and the engines report "
        "(vLLM's processed_logprobs): the ratios then hold no log S, S the kept mass. The KL "
        "towards the reference stays on the untruncated log-probs; S is logged as "
        "sampling/kept_mass. false: the full softmax (each token's sampler ratio then carries "
        "S, and the mismatch correction truncates or masks for it).",
        json_schema_extra=_LOSS,
    )
    off_policy_mask_threshold: float | None = Field(
        None,
        ge=0,
        description="DeepSeek-V3.2's off-policy sequence mask: a completion with a negative "
        "advantage whose mean log-ratio log pi_sampler - log pi_theta over its tokens exceeds "
        "this (e.g. 0.5) is left out of the policy term (its KL term stays). The sampler's "
        "log-probs see both the updates since generation and the engine's numerics; the share "
        "of tokens dropped is logged as off_policy_mask/masked_frac. null: off.",
        json_schema_extra=_LOSS,
    )
    use_bias_correction_kl: bool = Field(
        True,
        description="Multiply the k3 KL term by the importance ratio pi_theta / pi_old "
        "(DeepSeek-V3.2; TRL 1.16's default): unbiased for KL(pi_theta || pi_ref) on samples of "
        "pi_old, and its gradient is that KL's (k3 alone pulls along KL(pi_ref || pi_theta)'s). "
        "The same value on-policy, another gradient; changes nothing with beta 0. false: k3 "
        "alone (TRL before 1.16).",
        json_schema_extra=_LOSS,
    )
    num_iterations: int = Field(
        1,
        ge=1,
        description="Optimisation passes (mu) over each generation batch.",
        json_schema_extra=_LOSS,
    )
    loss_type: LossTypeName = Field(
        "dapo",
        description="The surrogate and how token losses are averaged: the clipped surrogate "
        "averaged over the tokens of the whole optimizer step (dapo), of a micro-batch (bnpo), "
        "per sequence then over sequences (grpo), over max_completion_length tokens per "
        "sequence (dr_grpo); cispo, MiniMax-M1's clipped and detached importance weight "
        "(averaged as dapo; set epsilon_high, its cap, e.g. 5.0); sapo, a soft sigmoid gate "
        "instead of the clip (averaged as grpo) (src/grpokit/core/losses.py).",
        json_schema_extra=_LOSS,
    )
    sapo_temperature_pos: float = Field(
        1.0,
        gt=0,
        description="loss_type sapo: the gate's temperature for positive advantages (higher "
        "decays the gradient faster as the ratio leaves 1).",
        json_schema_extra=_LOSS,
    )
    sapo_temperature_neg: float = Field(
        1.05,
        gt=0,
        description="loss_type sapo: the gate's temperature for negative advantages.",
        json_schema_extra=_LOSS,
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group",
        description="Divide advantages by the group std, the batch std, or not at all.",
        json_schema_extra=_LOSS,
    )
    advantage_estimator: Literal["grpo", "rloo"] = Field(
        "grpo",
        description="Baseline: group mean (GRPO) or leave-one-out mean (RLOO).",
        json_schema_extra=_LOSS,
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token", description="Per-token ratio, or one per sequence (GSPO).", json_schema_extra=_LOSS
    )
    mask_truncated_completions: bool = Field(
        False,
        description="Exclude completions that hit max_completion_length from the loss.",
        json_schema_extra=_LOSS,
    )
    reward_weights: list[float] | None = Field(
        None,
        description="One weight per reward, in the order of `rewards:`; it replaces their "
        "`weight:`. null: each reward's own weight (default 1).",
        json_schema_extra=_LOSS,
    )
    multi_objective_aggregation: MultiObjectiveAggregation = Field(
        "sum_then_normalize",
        description="How several rewards make one advantage: sum_then_normalize, the weighted "
        "sum of the rewards is the reward (advantage_estimator and scale_rewards apply to it); "
        "normalize_then_sum (GDPO), each reward gets its own group advantage (estimator and "
        "scale applied to it alone, a None left out of that reward's statistics and adding 0), "
        "their weighted sum is divided by its std over the batch, so that a dense score does "
        "not drown a 0/1 one (docs/math.md).",
        json_schema_extra=_LOSS,
    )
    # ---- entropy control (TRL's names and defaults; grpokit.core.entropy, docs/math.md)
    top_entropy_quantile: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="rho of 'Beyond the 80/20 Rule': only the tokens whose entropy is at or above "
        "the (1 - rho) quantile of each micro-batch's token entropies train the policy term (the "
        "KL still counts every token); 1 keeps every token, 0 only the highest-entropy one; the "
        "paper recommends 0.2. Tokens of masked truncated completions are not counted.",
        json_schema_extra=_LOSS,
    )
    entropy_coef: float = Field(
        0.0,
        description="Entropy bonus: the loss subtracts entropy_coef x the mean per-token entropy "
        "of the step (over the tokens the policy term trains), the same for every loss_type; 0 "
        "is off. With use_adaptive_entropy, the starting coefficient. Counters an entropy "
        "collapse (monitor entropy_collapse).",
        json_schema_extra=_LOSS,
    )
    use_adaptive_entropy: bool = Field(
        False,
        description="Skywork-OR1's adaptive entropy control: after each optimizer step the "
        "coefficient rises by entropy_coef_delta if the step's entropy was at or below "
        "entropy_target and falls by it otherwise (within entropy_coef_min..max), and is applied "
        "only while the last step's entropy is at or below entropy_target.",
        json_schema_extra=_LOSS,
    )
    entropy_coef_min: float = Field(
        0.0,
        description="use_adaptive_entropy: the coefficient's lower bound.",
        json_schema_extra=_LOSS,
    )
    entropy_coef_max: float = Field(
        1.0,
        description="use_adaptive_entropy: the coefficient's upper bound.",
        json_schema_extra=_LOSS,
    )
    entropy_coef_delta: float = Field(
        0.005,
        ge=0.0,
        description="use_adaptive_entropy: how much the coefficient moves per optimizer step.",
        json_schema_extra=_LOSS,
    )
    entropy_target: float = Field(
        0.2,
        description="use_adaptive_entropy: the mean per-token entropy (nats) at or below which "
        "the bonus applies and grows, measured over the tokens the policy term trains. Language "
        "models sample at 2-10 nats per token early on, so TRL's default 0.2 acts only on a "
        "near-total collapse; set it near the entropy metric of the first steps.",
        json_schema_extra=_LOSS,
    )

    # ---- optimisation
    seed: int = Field(
        42, description="Seed for data order, sampling and initialisation.", json_schema_extra=_OPT
    )
    learning_rate: float = Field(
        1e-6, gt=0, description="Peak learning rate of AdamW.", json_schema_extra=_OPT
    )
    num_train_epochs: float = Field(
        3.0, gt=0, description="Passes over the training prompts.", json_schema_extra=_OPT
    )
    max_steps: int = Field(
        -1,
        description="Optimizer steps to run; overrides epochs when > 0.",
        json_schema_extra=_OPT,
    )
    per_device_train_batch_size: int = Field(
        8,
        ge=1,
        description="Completions per micro-batch (TRL's meaning).",
        json_schema_extra=_OPT,
    )
    gradient_accumulation_steps: int = Field(
        1, ge=1, description="Micro-batches per optimizer step.", json_schema_extra=_OPT
    )
    optim: Literal["adamw_torch_fused", "adamw_torch", "adamw_bnb_8bit", "adamw_8bit"] = Field(
        "adamw_torch_fused",
        description="AdamW implementation: torch's fused kernel (one kernel for all parameters), "
        "torch's loop, or bitsandbytes' 8-bit states (adamw_bnb_8bit = adamw_8bit; needs "
        "`pip install bitsandbytes`).",
        json_schema_extra=_OPT,
    )
    max_grad_norm: float = Field(
        1.0, gt=0, description="Gradient clipping norm.", json_schema_extra=_OPT
    )
    max_nonfinite_steps: int = Field(
        3,
        ge=1,
        description=(
            "An optimizer step whose loss or gradient norm is NaN or infinite is skipped (the "
            "weights stay as they were; metric skipped_steps counts them). After this many "
            "skipped in a row the run stops with a checkpoint and the likely causes."
        ),
        json_schema_extra=_OPT,
    )
    lr_scheduler_type: Literal["constant", "constant_with_warmup", "linear", "cosine"] = Field(
        "linear", description="Learning-rate schedule after warm-up.", json_schema_extra=_OPT
    )
    warmup_ratio: float = Field(
        0.0, ge=0, lt=1, description="Warm-up share of the total steps.", json_schema_extra=_OPT
    )
    warmup_steps: int = Field(
        0,
        ge=0,
        description="Warm-up steps; overrides warmup_ratio when > 0. A value below 1 is a share "
        "of the total steps, as in transformers.",
        json_schema_extra=_OPT,
    )
    weight_decay: float = Field(
        0.0, ge=0, description="AdamW weight decay.", json_schema_extra=_OPT
    )
    adam_beta1: float = Field(
        0.9, ge=0, lt=1, description="AdamW beta1 (first-moment decay).", json_schema_extra=_OPT
    )
    adam_beta2: float = Field(
        0.999, ge=0, lt=1, description="AdamW beta2 (second-moment decay).", json_schema_extra=_OPT
    )
    adam_epsilon: float = Field(1e-8, ge=0, description="AdamW epsilon.", json_schema_extra=_OPT)
    bf16: bool = Field(
        False, description="Train in bfloat16 (sets model.dtype).", json_schema_extra=_OPT
    )
    cast_lm_head_to_fp32: bool = Field(
        False,
        description="Compute the output projection (lm head) in float32, its weights kept in "
        "float32 and the hidden states upcast, for the policy and the reference (ScaleRL's "
        "recipe): bfloat16 logits round each token's log-prob by up to about 1%, noise in every "
        "ratio. Changes nothing in a float32 model. Not with LoRA on the head.",
        json_schema_extra=_OPT,
    )
    gradient_checkpointing: bool | None = Field(
        None,
        description="TRL's name for model.gradient_checkpointing.",
        json_schema_extra=_OPT,
    )
    activation_checkpointing: bool | None = Field(
        None,
        description="transformers 5's name for gradient_checkpointing.",
        json_schema_extra=_OPT,
    )
    # A micro-batch of up to 1,024 completion positions (8 completions of 128 tokens) is one
    # chunk, whose logits are kept: no recomputation, the speed of projecting all at once.
    # Beyond, memory stays at about two chunks: 1,024 x 152k float32 logits are 623 MB.
    # Smaller chunks cost more recomputation (measured on the embedded model's head, 1,024
    # positions: +18% at 512, +28% at 256).
    logprob_chunk_size: int | None = Field(
        1024,
        ge=0,
        description=(
            "Completion positions projected to the vocabulary at once in the update's forwards: "
            "log-probs and entropy are computed from the hidden states a chunk of positions at "
            "a time, and a chunk's logits are recomputed in the backward pass (all but the last "
            "chunk's, when the output layer is trained), so memory grows with the chunk, not "
            "with tokens x vocabulary (a micro-batch of 8 x 1,024 tokens of a 152k vocabulary "
            "has 5 GB of float32 logits). TRL has no such field (its use_liger_loss fuses the "
            "projection into the loss for the same end). 0 or null: all positions at once."
        ),
        json_schema_extra=_OPT,
    )

    padding_free: bool = Field(
        False,
        description=(
            "Update without padding (TRL's SFTConfig name): each micro-batch's sequences, "
            "prompt and completion, are laid end to end in one row with position ids that "
            "start again at 0 for each, and the attention keeps each sequence to itself "
            "(transformers builds that mask from the position ids: a block-diagonal mask for "
            "sdpa and eager, variable-length kernels for FlashAttention). Saves the padding "
            "of micro-batches whose completions differ in length; each completion then "
            "carries its own copy of its prompt (no prompt encoded once per group). A model "
            "whose attention would mix packed sequences (checked on the first use) is refused."
        ),
        json_schema_extra=_OPT,
    )

    ref_logprobs_in_rollout: bool = Field(
        True,
        description=(
            "With LoRA, beta > 0, float32 compute, grpokit's own rollout engine and at most 8 "
            "completions per generation round and process (where it was measured to pay): "
            "score the sampled tokens under the reference model (the base, adapter off) while "
            "generating, on rows of their own beside the policy's that share each decoding "
            "step's reads of the frozen weights, instead of in a forward of its own before the "
            "update (as TRL does; false). The adapter is then computed beside the base in every rollout, never "
            "merged. The log-probs are the trainer's to float32 rounding. Ignored elsewhere "
            "(bfloat16 compute, vLLM, FSDP, full fine-tuning, models transformers' forward "
            "decodes, tool-use rollouts)."
        ),
        json_schema_extra=_OPT,
    )

    # ---- checkpointing
    output_dir: str | None = Field(
        None,
        description="Run directory; default runs/<config file name>.",
        json_schema_extra=_CKPT,
    )
    save_strategy: Literal["steps", "epoch", "best", "no"] = Field(
        "steps",
        description="When to checkpoint during the run: every save_steps steps, at the end of "
        "each epoch, at each held-out eval that sets a new best metric_for_best_model ('best'), "
        "or never ('no'). The final checkpoint is always written.",
        json_schema_extra=_CKPT,
    )
    save_steps: int = Field(
        500,
        ge=0,
        description="Checkpoint every N steps (save_strategy: steps); 0 = only at the end.",
        json_schema_extra=_CKPT,
    )
    save_minutes: float = Field(
        30.0,
        ge=0,
        description=(
            "Also checkpoint when this many minutes have passed since the last checkpoint "
            "(0 = off), whatever save_steps says: a crash, a full disk or a killed job never "
            "loses more than this much work. Not a TRL setting."
        ),
        json_schema_extra=_CKPT,
    )
    save_total_limit: int | None = Field(
        None,
        ge=1,
        description="Keep at most this many checkpoints (oldest deleted); null keeps them all. "
        "The latest (to resume) and the best by metric_for_best_model are never deleted: "
        "with a best one recorded, 1 keeps two.",
        json_schema_extra=_CKPT,
    )
    metric_for_best_model: str | None = Field(
        None,
        description="The held-out metric that ranks checkpoints: TRL's names (eval_reward, "
        "eval_rewards/<reward>/mean; the eval_ prefix optional) or grpokit's (eval/reward, "
        "eval/<reward>/mean, eval/<reward>/pass_rate, eval/<checklist>/<item>/pass_rate). "
        "Recorded at each periodic eval; the best checkpoint is the checkpoint written at the "
        "eval step with the best value (in its trainer_state.json as best_model_checkpoint), "
        "which save_total_limit keeps and `grpokit export RUN_DIR --best` exports. null: none "
        "tracked, unless load_best_model_at_end, save_strategy: best or early stopping asks "
        "for one, then eval_reward (transformers would take eval_loss, which GRPO's held-out "
        "eval does not measure).",
        json_schema_extra=_CKPT,
    )
    greater_is_better: bool | None = Field(
        None,
        description="Whether a higher metric_for_best_model is better; null: true (every "
        "held-out metric is a reward or a pass rate; transformers says true unless the name "
        "ends in 'loss').",
        json_schema_extra=_CKPT,
    )
    load_best_model_at_end: bool = Field(
        False,
        description="The run's model is its best checkpoint, not its latest: the run ends "
        "naming it, and grpokit export, eval and generate given the run directory load it. "
        "Needs the periodic eval (eval_strategy: steps, data.heldout) and checkpoints at eval "
        "steps: save_strategy: steps with save_steps a multiple of eval_steps (as "
        "transformers requires), or save_strategy: best.",
        json_schema_extra=_CKPT,
    )
    early_stopping_patience: int | None = Field(
        None,
        ge=1,
        description="Stop the run after this many periodic evals in a row that did not "
        "improve metric_for_best_model (transformers' EarlyStoppingCallback); the run ends "
        "with a checkpoint as at max_steps. null: off.",
        json_schema_extra=_CKPT,
    )
    early_stopping_threshold: float = Field(
        0.0,
        ge=0,
        description="An eval improves only if it beats the best value so far by more than "
        "this (EarlyStoppingCallback's early_stopping_threshold).",
        json_schema_extra=_CKPT,
    )

    # ---- logging
    logging_steps: int = Field(
        10,
        ge=1,
        description="Report to report_to every N steps (metrics.jsonl gets every step, and "
        "the console a line per step, or a live bar on a terminal).",
        json_schema_extra=_LOG,
    )
    report_to: list[ReportTo] = Field(
        default_factory=_default_report_to,
        description="Metric sinks besides metrics.jsonl: a name or a list of names; 'none' for "
        "none.",
        json_schema_extra=_LOG,
    )
    log_completions: bool = Field(
        True, description="Write sampled completions to completions.jsonl.", json_schema_extra=_LOG
    )
    log_completions_steps: int = Field(
        1, ge=1, description="Write completions every N steps.", json_schema_extra=_LOG
    )
    num_completions_to_print: int = Field(
        8,
        ge=0,
        description="Completions written per logged step.",
        json_schema_extra=_LOG,
    )
    eval_strategy: Literal["no", "steps"] = Field(
        "no",
        description="Periodic held-out eval: 'steps' every eval_steps steps, 'no' never. "
        "Setting eval_steps alone turns it on.",
        json_schema_extra=_LOG,
    )
    eval_steps: int | None = Field(
        None,
        ge=0,
        description="Evaluate on data.heldout every N steps; default logging_steps.",
        json_schema_extra=_LOG,
    )
    eval_samples: int = Field(
        1, ge=1, description="Samples per held-out prompt in periodic eval.", json_schema_extra=_LOG
    )
    eval_max_prompts: int = Field(
        16, ge=1, description="Held-out prompts used by periodic eval.", json_schema_extra=_LOG
    )

    # ---- distribution
    num_processes: int = Field(
        1,
        ge=1,
        description="Data-parallel processes (set by the launcher; 1 on a laptop).",
        json_schema_extra=_DIST,
    )
    max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        description=(
            "Token budget of a micro-batch in the update (verl's ppo_max_token_len_per_gpu): "
            "consecutive completions are cut into micro-batches of at most "
            "per_device_train_batch_size rows whose padded size (rows x (longest prompt + "
            "longest completion); with padding_free, the rows' own tokens summed) stays within "
            "it; a longer single row goes alone. Bounds the "
            "update's memory when a few completions run long, and their padding. The update is "
            "the same for dapo, dr_grpo and grpo (normalised per step or per sequence); bnpo "
            "normalises per micro-batch by definition. null: rows only."
        ),
        json_schema_extra=_DIST,
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
        json_schema_extra=_DIST,
    )
    fsdp_config: FSDPConfig = Field(
        default_factory=FSDPConfig,
        description="FSDP settings (transformers' fsdp_config keys).",
        json_schema_extra=_DIST,
    )

    @model_validator(mode="before")
    @classmethod
    def _trl_forms(cls, data: Any) -> Any:
        """TRL's and transformers' ways of writing these settings, read as grpokit's
        (grpokit.config.trl_forms); a ValueError there is reported at the training: section."""
        return from_trl_forms(data) if isinstance(data, dict) else data

    @field_validator("fsdp", mode="before")
    @classmethod
    def _fsdp_option(cls, value: Any) -> Any:
        if isinstance(value, str):
            legacy_fsdp(value)  # raises the reason it was not translated
        return value

    @field_validator("logging_steps", "save_steps", "eval_steps", "warmup_steps", mode="before")
    @classmethod
    def _whole_steps(cls, value: Any) -> Any:
        if isinstance(value, float) and not isinstance(value, bool):
            if not value.is_integer():
                raise ValueError(
                    f"{value} is not a whole number of steps (a value below 1 as a share of the "
                    "run is transformers' form, which grpokit takes only for warmup_steps)"
                )
            return int(value)
        return value

    @field_validator("report_to", mode="before")
    @classmethod
    def _report_to_list(cls, value: Any) -> Any:
        names = [value] if isinstance(value, str) else value
        if isinstance(names, list):
            if "all" in names:
                raise ValueError(
                    "'all' (every installed integration) is not supported: name the sinks, "
                    "e.g. [tensorboard, wandb]"
                )
            if "none" in names and len(names) > 1:
                raise ValueError("'none' cannot be combined with other sinks")
        return names

    @field_validator("generation_kwargs", "chat_template_kwargs", mode="before")
    @classmethod
    def _json_mapping(cls, value: Any) -> Any:
        # TRL's command line passes these mappings as JSON text.
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"not a mapping nor JSON text of one ({e.msg})") from None
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        reserved = sorted(set(value or {}) & set(_TEMPLATE_ARGS))
        if reserved:
            raise ValueError(
                f"{', '.join(reserved)}: set by grpokit when it encodes a prompt; give only the "
                "template's own variables"
            )
        return value

    @model_validator(mode="after")
    def _generation_kwargs(self) -> TrainingConfig:
        for key, value in (self.generation_kwargs or {}).items():
            if key not in GENERATION_KWARGS:
                raise ValueError(
                    f"generation_kwargs.{key}: not a setting grpokit's samplers take; they take "
                    f"{', '.join(GENERATION_KWARGS)}"
                )
            # The value is checked as the field of the same name checks it.
            try:
                type(self).__pydantic_validator__.validate_assignment(
                    type(self).model_construct(), key, value
                )
            except ValidationError as e:
                msg = e.errors()[0]["msg"].removeprefix("Value error, ")
                raise ValueError(f"generation_kwargs.{key}: {msg}") from None
        return self

    @model_validator(mode="after")
    def _tool_call_pattern(self) -> TrainingConfig:
        if self.tool_call_format == "regex":
            if self.tool_call_regex is None:
                raise ValueError("tool_call_format: regex needs tool_call_regex")
            check_pattern(self.tool_call_regex)
        elif self.tool_call_regex is not None:
            raise ValueError(
                "tool_call_regex is set but tool_call_format is not 'regex'; set both or neither"
            )
        return self

    @model_validator(mode="after")
    def _batch_arithmetic(self) -> TrainingConfig:
        self._check_steps_per_generation()
        gen = self.completions_per_generation
        given = self.steps_per_generation is not None or self.generation_batch_size is not None
        if gen % self.num_generations and given:  # the groups must be whole (TRL's rule)
            raise ValueError(
                f"the generation batch of {gen} completions (steps_per_generation / "
                f"generation_batch_size) is not divisible by num_generations = "
                f"{self.num_generations}; make it a multiple"
            )
        if gen % self.num_generations:
            raise ValueError(
                f"the generation batch per_device_train_batch_size x num_processes x "
                f"gradient_accumulation_steps = {self.per_device_train_batch_size} x "
                f"{self.num_processes} x {self.gradient_accumulation_steps} = {gen} completions is "
                f"not divisible by num_generations = {self.num_generations}; make it a multiple, "
                f"e.g. gradient_accumulation_steps: "
                f"{_fix_accumulation(self.per_device_train_batch_size * self.num_processes, self.num_generations)}"
            )
        self._check_loss_settings()
        if self.max_staleness:
            self._check_generating_ahead()
        if self.fsdp and self.cast_lm_head_to_fp32:
            raise ValueError(
                "fsdp and cast_lm_head_to_fp32 cannot be combined: FSDP shards units whose "
                "parameters share one dtype, and the float32 head would not"
            )
        if self.fsdp and self.use_vllm:
            raise ValueError(
                "fsdp and use_vllm cannot be combined: vLLM keeps a whole copy of the weights on "
                "each GPU and its weight sync reads whole parameters, which FSDP shards; generate "
                "with torch (use_vllm: false) under fsdp"
            )
        return self

    @model_validator(mode="after")
    def _best_checkpoint(self) -> TrainingConfig:
        if self.metric_for_best_model is not None:
            heldout_metric_name(self.metric_for_best_model)  # raises naming the accepted forms
        asks = [
            name
            for name, on in (
                ("load_best_model_at_end", self.load_best_model_at_end),
                ("save_strategy: best", self.save_strategy == "best"),
                ("early_stopping_patience", self.early_stopping_patience is not None),
            )
            if on
        ]
        if asks and not self.eval_interval:
            raise ValueError(
                f"{asks[0]} needs the periodic held-out eval: set eval_strategy: steps (and "
                "eval_steps), with data.heldout"
            )
        if self.load_best_model_at_end:
            every = self.eval_interval
            if self.save_strategy == "epoch":
                raise ValueError(
                    "load_best_model_at_end needs checkpoints at eval steps; epochs end where "
                    "the eval may not fall: use save_strategy: steps with save_steps a multiple "
                    f"of eval_steps ({every}), or save_strategy: best"
                )
            if self.save_strategy == "steps" and self.save_steps % every:
                raise ValueError(
                    f"load_best_model_at_end needs checkpoints at eval steps: save_steps "
                    f"{self.save_steps} is not a multiple of eval_steps {every} (transformers "
                    "refuses it too); make it one, or use save_strategy: best"
                )
        return self

    def _check_steps_per_generation(self) -> None:
        """TRL's rules for steps_per_generation and generation_batch_size, and grpokit's one more:
        a whole number of optimizer steps per generation."""
        steps, size = self.steps_per_generation, self.generation_batch_size
        per_micro_step = self.per_device_train_batch_size * self.num_processes
        if size is not None and steps is not None and size != per_micro_step * steps:
            # A TRL dump has both, resolved; consistent values are the same setting.
            raise ValueError(
                "generation_batch_size and steps_per_generation cannot both be set (unless "
                f"generation_batch_size = per_device_train_batch_size x processes x "
                f"steps_per_generation = {per_micro_step * steps}); set one"
            )
        if size is not None and size % per_micro_step:
            raise ValueError(
                f"generation_batch_size {size} is not divisible by per_device_train_batch_size x "
                f"processes = {per_micro_step}"
            )
        micro = self.micro_batches_per_generation
        if micro % self.gradient_accumulation_steps:
            # TRL would then generate more than once per optimizer step; here one generation
            # feeds whole optimizer steps.
            raise ValueError(
                f"steps_per_generation {micro} (micro-batches per generation) must be a multiple "
                f"of gradient_accumulation_steps {self.gradient_accumulation_steps}: each "
                "generation feeds whole optimizer steps"
            )

    def _check_loss_settings(self) -> None:
        """Build the loss's and the entropy control's settings, which check their values as they
        are built (delta, cispo's cap, the entropy coefficient's bounds) and raise ValueError
        naming the field: a bad value stops the config as it loads, not the run's first step."""
        _ = self.loss_settings
        _ = self.entropy_control

    def _check_generating_ahead(self) -> None:
        """What max_staleness > 0 needs: a generation that runs beside the trainer, whose older
        policy is corrected for, in rounds of one size."""
        why = None
        if not (self.use_vllm and self.vllm_mode == "server"):
            why = (
                "needs use_vllm: true with vllm_mode: server (the torch engine and a colocated "
                "vLLM generate in the training process itself)"
            )
        elif not self.vllm_importance_sampling_correction:
            why = (
                "samples from an older policy, which vllm_importance_sampling_correction "
                "corrects for; turn it on"
            )
        elif self.dynamic_sampling:
            why = "takes rounds of one size ahead; dynamic_sampling tops rounds up"
        if why:
            raise ValueError(f"max_staleness: {self.max_staleness} {why}, or set max_staleness: 0")

    @property
    def loss_settings(self) -> LossSettings:
        """The policy loss's hyperparameters (raises ValueError naming a bad one)."""
        from grpokit.core.losses import LossSettings, MismatchCorrection

        return LossSettings(
            loss_type=self.loss_type,
            epsilon_low=self.epsilon,
            epsilon_high=self.epsilon_high,
            beta=self.beta,
            importance_sampling_level=self.importance_sampling_level,
            max_completion_length=self.max_completion_length,
            delta=self.delta,
            sapo_temperature_pos=self.sapo_temperature_pos,
            sapo_temperature_neg=self.sapo_temperature_neg,
            mismatch=MismatchCorrection(
                mode=self.vllm_importance_sampling_mode,
                clip_min=self.vllm_importance_sampling_clip_min,
                clip_max=self.vllm_importance_sampling_clip_max,
            )
            if self.use_vllm and self.vllm_importance_sampling_correction
            else None,
            off_policy_mask_threshold=self.off_policy_mask_threshold,
            use_bias_correction_kl=self.use_bias_correction_kl,
        )

    @property
    def curriculum_settings(self) -> Curriculum | None:
        """The curriculum's settings (None: off)."""
        from grpokit.core.curriculum import Curriculum

        c = self.curriculum
        if c is None:
            return None
        return Curriculum(c.easy_threshold, c.easy_keep_prob, c.hard_keep_prob)

    @property
    def entropy_control(self) -> EntropyControl:
        """The entropy settings (raises ValueError naming a bad one)."""
        from grpokit.core.entropy import EntropyControl

        return EntropyControl(
            top_entropy_quantile=self.top_entropy_quantile,
            entropy_coef=self.entropy_coef,
            use_adaptive_entropy=self.use_adaptive_entropy,
            entropy_coef_min=self.entropy_coef_min,
            entropy_coef_max=self.entropy_coef_max,
            entropy_coef_delta=self.entropy_coef_delta,
            entropy_target=self.entropy_target,
        )

    @property
    def micro_batches_per_generation(self) -> int:
        """steps_per_generation resolved as TRL resolves it: given, from generation_batch_size,
        or gradient_accumulation_steps."""
        if self.steps_per_generation is not None:
            return self.steps_per_generation
        if self.generation_batch_size is not None:
            return self.generation_batch_size // (
                self.per_device_train_batch_size * self.num_processes
            )
        return self.gradient_accumulation_steps

    @property
    def completions_per_generation(self) -> int:
        """Completions generated at once (all processes): generation_batch_size resolved."""
        return (
            self.per_device_train_batch_size
            * self.num_processes
            * self.micro_batches_per_generation
        )

    @property
    def updates_per_generation(self) -> int:
        """Optimizer steps each pass takes on one generation batch (its slices)."""
        return self.micro_batches_per_generation // self.gradient_accumulation_steps

    @property
    def updates_per_round(self) -> int:
        """Optimizer steps per generation round: num_iterations passes over its slices."""
        return self.num_iterations * self.updates_per_generation

    @property
    def prompts_per_step(self) -> int:
        """Prompts per generation round (per optimizer step with the defaults)."""
        return self.completions_per_generation // self.num_generations

    @property
    def optimizer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the AdamW that `optim` names: ``torch.optim.AdamW`` (with
        ``fused`` for adamw_torch_fused) or, when :attr:`adamw_8bit`, bitsandbytes'
        ``AdamW8bit``."""
        kwargs: dict[str, Any] = {
            "lr": self.learning_rate,
            "betas": (self.adam_beta1, self.adam_beta2),
            "eps": self.adam_epsilon,
            "weight_decay": self.weight_decay,
        }
        if not self.adamw_8bit:
            kwargs["fused"] = self.optim == "adamw_torch_fused"
        return kwargs

    @property
    def adamw_8bit(self) -> bool:
        """Whether `optim` is bitsandbytes' 8-bit AdamW."""
        return self.optim in _8BIT_ADAMW

    @property
    def sampling_params(self) -> SamplingParams:
        """How this section samples completions: max_completion_length, temperature, top_p,
        top_k (None = 0, off), min_p (None = 0.0, off) and repetition_penalty, with
        generation_kwargs overriding the fields (TRL's precedence)."""
        s: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
        } | dict(self.generation_kwargs or {})
        # generation_kwargs are checked as their fields are but kept as written (an int for a
        # float, a null for top_k or min_p): cast here.
        from grpokit.rollout.base import SamplingParams

        return SamplingParams(
            max_completion_length=self.max_completion_length,
            temperature=float(s["temperature"]),
            top_p=float(s["top_p"]),
            top_k=int(s["top_k"] or 0),
            min_p=float(s["min_p"] or 0.0),
            repetition_penalty=float(s["repetition_penalty"]),
        )

    @property
    def best_metric(self) -> str | None:
        """The held-out metric (grpokit's name, e.g. ``eval/reward``) that ranks checkpoints, or
        None when no best checkpoint is tracked."""
        if self.metric_for_best_model is not None:
            return heldout_metric_name(self.metric_for_best_model)
        wants = (
            self.load_best_model_at_end
            or self.save_strategy == "best"
            or self.early_stopping_patience is not None
        )
        return "eval/reward" if wants else None

    @property
    def best_is_greater(self) -> bool:
        """Whether a higher best_metric is better."""
        return True if self.greater_is_better is None else self.greater_is_better

    def save_interval(self, steps_per_epoch: int) -> int:
        """Steps between checkpoints during the run (0: none before the final one)."""
        if self.save_strategy == "epoch":
            return steps_per_epoch
        return self.save_steps if self.save_strategy == "steps" else 0

    @property
    def eval_interval(self) -> int:
        """Steps between periodic held-out evals (0: off); eval_steps defaults to logging_steps
        as in transformers."""
        if self.eval_strategy == "no":
            return 0
        return self.logging_steps if self.eval_steps is None else self.eval_steps


_TRL_REWARD_MEAN = re.compile(r"^rewards/(?P<name>.+)/mean$")


def heldout_metric_name(name: str) -> str:
    """grpokit's name of the held-out metric ``name`` (TRL's eval_reward or
    eval_rewards/<reward>/mean, the eval_ prefix optional, or grpokit's eval/... itself).

    Raises:
        ValueError: a metric the periodic held-out eval does not log, naming the forms it takes.
    """
    if name.startswith("eval/") and len(name) > len("eval/"):
        return name
    bare = name.removeprefix("eval_")
    if bare == "reward":
        return "eval/reward"
    match = _TRL_REWARD_MEAN.match(bare)
    if match:
        return f"eval/{match.group('name')}/mean"
    why = (
        "grpokit's held-out eval samples and scores completions; it computes no loss"
        if bare.endswith("loss")
        else "the periodic held-out eval does not log it"
    )
    raise ValueError(
        f"metric_for_best_model {name!r}: {why}; use eval_reward, eval_rewards/<reward>/mean, "
        "or grpokit's eval/reward, eval/<reward>/mean, eval/<reward>/pass_rate"
    )


def _fix_accumulation(per_step: int, group: int) -> int:
    for k in range(1, group + 1):
        if (per_step * k) % group == 0:
            return k
    return group
