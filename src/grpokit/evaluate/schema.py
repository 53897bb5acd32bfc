"""The eval.json file that ``grpokit eval`` writes and ``grpokit report --eval`` reads.

Format ``grpokit-eval/1``: one object with the settings every model was sampled with, a summary per
model (per reward: mean, pass count, pass rate with a 95% interval, pass@k), the seed
article's per-prompt table (samples and compliant count per model), and paired comparisons of each
model against the first one (the base). A sample is *compliant* when every reward that has a pass
threshold reaches it; rewards without one (unbounded scores) only enter the means.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

EVAL_FORMAT: Literal["grpokit-eval/1"] = "grpokit-eval/1"

IntervalMethod = Literal["wilson", "prompt-cluster"]
"""How pass-rate intervals were computed: over samples as if independent, or over prompts."""
CLUSTER_INTERVALS: IntervalMethod = "prompt-cluster"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RewardSummary(_Strict):
    mean: float | None = Field(description="Mean over samples where the reward applied.")
    std: float | None = Field(description="Standard deviation over those samples (n - 1).")
    n: int = Field(description="Samples where the reward applied (not None).")
    none_count: int = Field(description="Samples where the reward returned None (not applicable).")
    threshold: float | None = Field(
        description="Pass threshold (the reward's maximum unless set); None: no pass rate."
    )
    passed: int | None = Field(description="Samples at or above the threshold.")
    pass_rate: float | None = Field(description="passed / n (samples where the reward applied).")
    pass_ci: tuple[float, float] | None = Field(
        description="95% interval of pass_rate (EvalResult.intervals says how)."
    )
    pass_at_k: dict[int, float] = Field(
        default_factory=dict,
        description="Unbiased pass@k averaged over prompts, for k = 1, 2, 4, ... up to samples.",
    )


class PartSummary(_Strict):
    pass_rate: float | None = Field(
        description="Mean of the part's values (0/1 successes or probabilities of success) over "
        "the samples where it applied: its success rate."
    )
    ci: tuple[float, float] | None = Field(
        description="95% per-prompt (cluster) interval of pass_rate: Wilson on the effective "
        "sample size for 0/1 values, a t interval on the cluster standard error for "
        "probabilities; None with fewer than two prompts for probabilities."
    )
    n: int = Field(description="Samples where the part applied (not None).")


class ModelSummary(_Strict):
    label: str = Field(description="Short name of the model in tables (unique).")
    path: str = Field(description="What was loaded: a directory, a hub name or the embedded model.")
    samples: int = Field(description="Completions scored (prompts x samples per prompt).")
    compliant: int | None = Field(
        description="Samples that pass every reward with a threshold; None when none has one."
    )
    compliant_rate: float | None = Field(description="compliant / samples.")
    compliant_ci: tuple[float, float] | None = Field(
        description="95% interval of compliant_rate (EvalResult.intervals says how)."
    )
    mean_length: float = Field(description="Mean completion length in tokens.")
    truncated_frac: float = Field(description="Share of completions cut at max_completion_length.")
    text: dict[str, float] = Field(
        default_factory=dict, description="Text metrics of grpokit.monitor.text_stats."
    )
    rewards: dict[str, RewardSummary] = Field(description="Per reward function.")
    checklist: dict[str, PartSummary] = Field(
        default_factory=dict,
        description="Per reward part (a checklist item), keyed by its held-out metric "
        "eval/checklist/<item>/pass_rate.",
    )
    seconds: float = Field(default=0.0, description="Wall time to sample and score this model.")


class PromptResult(_Strict):
    index: int = Field(description="0-based row of the held-out file.")
    prompt: str = Field(description="The prompt's user text as shown in the table.")
    samples: int = Field(description="Samples per model for this prompt.")
    compliant: dict[str, int] = Field(
        description="Compliant samples per model label; empty when no reward has a threshold."
    )
    reward_mean: dict[str, dict[str, float | None]] = Field(
        default_factory=dict, description="model label -> reward -> mean over the samples."
    )


class PairedComparison(_Strict):
    metric: str = Field(
        description="A reward name, 'compliant' for the compliant share, or a checklist item's "
        "eval/checklist/<item>/pass_rate."
    )
    base: str = Field(description="Label of the reference model (the first given).")
    other: str = Field(description="Label of the compared model.")
    diff: float = Field(description="Mean over prompts of other - base (per-prompt means).")
    ci: tuple[float, float] | None = Field(
        description=(
            "95% t interval of diff over prompts (the prompts are the independent units); None "
            "with fewer than two prompts."
        )
    )
    n_prompts: int = Field(description="Prompts in the comparison.")
    at_equal_length: tuple[float, float, float] | None = Field(
        default=None,
        description=(
            "(difference, low, high): other - base among answers of the same length, the "
            "model's coefficient in a least-squares fit of each sample's value on the model and "
            "its length in tokens, with a 95% interval from resampling the prompts "
            "(grpokit.core.stats.length_adjusted_difference). A gain in diff that vanishes here "
            "came with longer answers. None when the fit has no answer, with fewer than 5 "
            "prompts (too few to resample), and in files written before it existed."
        ),
    )
    among: str | None = Field(
        default=None,
        description="None: over every sample; a reward's name: over the samples that pass that "
        "reward's threshold only (`grpokit eval --among`), e.g. the formatted answers.",
    )


class TranscriptSample(_Strict):
    model: str = Field(description="Label of the model that wrote it.")
    prompt_index: int = Field(description="0-based row of the held-out file.")
    sample: int = Field(description="Which of the prompt's samples (0-based).")
    messages: list[dict[str, Any]] = Field(
        description="The model's turns with their tool calls, and the tool messages with their "
        "results (completions.jsonl's transcript)."
    )


class EvalResult(_Strict):
    format: Literal["grpokit-eval/1"] = Field(
        default=EVAL_FORMAT, description="File format and version."
    )
    created: str = Field(description="When the eval ran (ISO 8601).")
    heldout: str = Field(description="The held-out prompt file.")
    samples_per_prompt: int = Field(description="K: samples per prompt and model.")
    seed: int = Field(description="Sampling seed; the same for every model.")
    sampling: dict[str, float | int | None] = Field(
        description="Sampling settings shared by all models (temperature, top_p, ...)."
    )
    rewards: list[str] = Field(description="Reward functions, in config order.")
    thresholds: dict[str, float] = Field(
        default_factory=dict,
        description="Pass threshold per reward that has one (its maximum unless --pass set it).",
    )
    models: list[ModelSummary] = Field(description="One entry per model, the base first.")
    prompts: list[PromptResult] = Field(description="The per-prompt table.")
    paired: list[PairedComparison] = Field(description="Each later model against the first.")
    alerts: list[dict[str, object]] = Field(
        default_factory=list,
        description="Monitor alerts on the eval samples: rule, model, value, message.",
    )
    transcripts: list[TranscriptSample] = Field(
        default_factory=list,
        description="With tools: whole transcripts of the first prompts, one per model and "
        "prompt (a sample that called a tool where there is one); every sample's is in "
        "completions.jsonl.",
    )
    intervals: IntervalMethod = Field(
        default="wilson",
        description=(
            "How pass_ci and compliant_ci were computed: 'prompt-cluster' (samples of a prompt "
            "correlated; what grpokit eval writes) or 'wilson' (samples independent; files "
            "written before the cluster intervals)."
        ),
    )
