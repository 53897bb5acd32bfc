"""The YAML parameters of a ``type: judge`` reward entry."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ScoreRange = tuple[float, float]


def _forbid_inline_key(data: Any) -> Any:
    if isinstance(data, dict) and "api_key" in data:
        raise ValueError(
            "api_key must not be written in the config file: put the key in an environment "
            "variable and give that variable's name in api_key_env (e.g. api_key_env: "
            "OPENAI_API_KEY)"
        )
    return data


# Request-body fields the OpenAI backend sets from the judge's settings. A streamed reply would
# not be one JSON body, so stream is kept off too.
RESERVED_BODY_KEYS = frozenset(
    {
        "model",
        "messages",
        "temperature",
        "max_tokens",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "stream",
    }
)


def _check_range(score_range: ScoreRange | None) -> None:
    if score_range is not None and not score_range[0] < score_range[1]:
        raise ValueError(f"score_range must be [low, high] with low < high, got {score_range}")


class _JudgeOverrides(BaseModel):
    """Per-judge settings shared by all backends; unset ones inherit from the reward entry."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        default=None,
        description="A label for this judge in metrics (judge/<name>/mean) and audit tables; "
        "defaults to its position in the list (0, 1, ...).",
    )
    rubric: str | None = Field(
        default=None,
        description="This judge's own rubric template (a different phrasing for an ensemble); "
        "defaults to the entry's rubric.",
    )
    rubric_file: str | None = Field(
        default=None,
        description="This judge's own rubric file, relative to the config file.",
    )
    score_range: ScoreRange | None = Field(
        default=None,
        description="This judge's score scale if its rubric uses another one; defaults to the "
        "entry's score_range.",
    )
    temperature: float = Field(
        default=0.0,
        ge=0.0,
        description="Sampling temperature of the judge. 0 (greedy) makes scores repeatable.",
    )
    max_tokens: int = Field(
        default=32,
        ge=1,
        description="Most tokens the judge may write. The rubric asks for a number; a judge "
        "that reasons before scoring needs more.",
    )
    top_logprobs: int = Field(
        default=20,
        ge=1,
        le=20,
        description="How many alternative tokens per position the expected mode reads "
        "(OpenAI's limit is 20).",
    )

    @model_validator(mode="after")
    def _one_rubric(self) -> _JudgeOverrides:
        if self.rubric is not None and self.rubric_file is not None:
            raise ValueError("give either rubric or rubric_file for a judge, not both")
        _check_range(self.score_range)
        return self


class OpenAIJudge(_JudgeOverrides):
    """A judge behind an OpenAI-compatible chat completions endpoint (vLLM, llama.cpp server,
    Ollama, hosted APIs)."""

    backend: Literal["openai"] = Field(description="An OpenAI-compatible HTTP endpoint.")
    base_url: str = Field(
        description="The API root, up to and including /v1, e.g. http://127.0.0.1:8080/v1."
    )
    model: str = Field(description="The model name the endpoint expects in requests.")
    api_key_env: str | None = Field(
        default=None,
        description="Name of the environment variable holding the API key (never the key "
        "itself). Unset: no Authorization header, as local servers need.",
    )
    timeout_s: float = Field(
        default=60.0, gt=0, description="Seconds one request may take before it is abandoned."
    )
    max_retries: int = Field(
        default=3,
        ge=0,
        description="Retries after a timeout, connection error, HTTP 429 or 5xx, with "
        "exponential back-off.",
    )
    backoff_s: float = Field(
        default=0.5,
        ge=0,
        description="First back-off delay; doubled after each failed attempt (capped at 30 s), "
        "or the server's Retry-After (seconds or an HTTP date, up to 300 s) when longer; a "
        "Retry-After holds back every request to the endpoint.",
    )
    max_concurrency: int = Field(
        default=8,
        ge=1,
        description="Most requests in flight at once to this endpoint.",
    )
    max_requests_per_minute: int | None = Field(
        default=None,
        ge=1,
        description="Most requests started per minute (an API's RPM limit), evenly spaced; "
        "unset: no limit.",
    )
    max_tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        description="Most tokens (prompt and reply, as the server's usage counts them) per "
        "minute (an API's TPM limit); a request books its prompt and reply limit before it "
        "starts, corrected by the usage it reports. Unset: no limit.",
    )
    price_per_million_input_tokens: float | None = Field(
        default=None,
        ge=0.0,
        description="Price of a million prompt tokens, to log the judge's cost per step "
        "(judge/<name>/cost) from the server's usage; any currency.",
    )
    price_per_million_output_tokens: float | None = Field(
        default=None,
        ge=0.0,
        description="Price of a million reply tokens (reasoning included, as the usage counts "
        "them), for judge/<name>/cost.",
    )
    max_completion_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Send the token limit as OpenAI's max_completion_tokens (which reasoning "
        "models require, and which counts their hidden reasoning too) with this value, instead "
        "of max_tokens. Unset: max_tokens is sent, and sent as max_completion_tokens from the "
        "first time the server answers that max_tokens is unsupported.",
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="More fields merged into every request body, e.g. {reasoning_effort: low} "
        "or {seed: 0}; they are part of the cache key. They add to grpokit's fields and cannot "
        "replace them: " + ", ".join(sorted(RESERVED_BODY_KEYS)) + " have their own settings.",
    )
    check_at_start: bool = Field(
        default=True,
        description="When the reward is built, contact the endpoint and score one fixed sample "
        "with a real request, so an unreachable URL, a rejected key, a request the server "
        "refuses or a reply without a score stops the run before training.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_inline_key(cls, data: Any) -> Any:
        return _forbid_inline_key(data)

    @model_validator(mode="after")
    def _own_keys_not_in_extra_body(self) -> OpenAIJudge:
        clash = sorted(RESERVED_BODY_KEYS & set(self.extra_body))
        if clash:
            raise ValueError(
                f"extra_body sets {', '.join(clash)}, which grpokit sets itself: use the judge's "
                "own settings (model, temperature, max_tokens, max_completion_tokens, "
                "top_logprobs; mode: expected for logprobs) instead"
            )
        if self.max_completion_tokens is not None and "max_tokens" in self.model_fields_set:
            raise ValueError(
                "give either max_tokens or max_completion_tokens, not both (one token limit is "
                "sent)"
            )
        return self


class LlamaServerJudge(OpenAIJudge):
    """A judge grpokit serves itself: llama.cpp's server (xllamacpp, installed by `make setup`)
    on a GGUF model, started when the reward is built and stopped with it, on a free local
    port. The requests are the OpenAI backend's, so every setting of ``backend: openai``
    applies; ``base_url`` is the server's own."""

    backend: Literal["llama_server"] = Field(  # type: ignore[assignment]
        description="llama.cpp's server on a GGUF model, started and stopped by grpokit."
    )
    base_url: str = Field(
        default="",
        description="Set by grpokit to the address of the server it started; leave it unset.",
    )
    model: str = Field(
        default="smollm2-135m-instruct",
        description="The model to serve: a named model (`grpokit models` lists them, e.g. "
        "qwen2.5-coder-1.5b-instruct) or a .gguf file (relative to the config file).",
    )
    max_concurrency: int = Field(
        default=1,
        ge=1,
        description="Requests in flight at once; the server has one slot per request, and one "
        "slot keeps each completion's prompt cached for its next question.",
    )
    threads: int = Field(
        default=2,
        ge=1,
        description="CPU threads of the server, for reading prompts and for writing replies; "
        "on a CPU it shares with training, they take turns (the judge runs between rollouts).",
    )
    ctx: int = Field(
        default=4096,
        ge=256,
        description="The server's context length in tokens (times max_concurrency): the "
        "longest judge prompt and its reply must fit.",
    )
    start_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Seconds to wait for the server to load the model and answer.",
    )


class LocalJudge(_JudgeOverrides):
    """A judge model run in-process with transformers (no server needed)."""

    backend: Literal["local"] = Field(description="An in-process Hugging Face causal LM.")
    model: str = Field(
        default="smollm2-135m-instruct",
        description="The embedded default name, a local model directory, or a hub name.",
    )
    device: str = Field(
        default="auto",
        description="Torch device for the judge model; auto picks cuda when present, else cpu.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="Weights' dtype; auto is bfloat16 on cuda and float32 on cpu.",
    )
    batch_size: int = Field(
        default=8, ge=1, description="Judge prompts scored together in one generate call."
    )


JudgeSpec = Annotated[OpenAIJudge | LlamaServerJudge | LocalJudge, Field(discriminator="backend")]


class JudgeParams(BaseModel):
    """An LLM-as-a-judge reward: one or several judges score each completion against a rubric,
    the score is read from their reply and normalised to [0, 1]."""

    model_config = ConfigDict(extra="forbid")

    rubric: str | None = Field(
        default=None,
        description="The judge prompt template. {completion} is replaced by the completion, "
        "{prompt} by the user prompt, {column} by any dataset column; write {{ and }} for "
        "literal braces.",
    )
    rubric_file: str | None = Field(
        default=None,
        description="A file holding the rubric template, relative to the config file.",
    )
    score_range: ScoreRange = Field(
        default=(0.0, 1.0),
        description="[low, high] of the scale the rubric asks for; scores are normalised from "
        "it to [0, 1].",
    )
    scoring: Literal["absolute", "group"] = Field(
        default="absolute",
        description="absolute: each completion is judged alone against the rubric. group: the "
        "completions of one prompt are shown to the judge together in one request (the "
        "group_rubric), in a seeded shuffled order, and scored relative to each other; the "
        "scores are mapped back to their completions. A completion gated out is not shown.",
    )
    group_rubric: str | None = Field(
        default=None,
        description="The judge prompt template of scoring: group. {completions} is replaced by "
        'the group\'s answers, each as <answer id="N">...</answer> (N = 1, 2, ... in the '
        "shuffled order), {count} by how many there are, {prompt} by the user prompt, {column} "
        "by a dataset column. It must ask for one line `N: score` per answer on score_range.",
    )
    group_rubric_file: str | None = Field(
        default=None,
        description="A file holding the group_rubric template, relative to the config file.",
    )
    shuffle_seed: int = Field(
        default=0,
        description="Seed of the order the answers of a group are shown in (scoring: group). "
        "The order is drawn from this seed and the answers' texts, so the same group is shown "
        "the same way again (the cache answers it) and position bias averages out over groups.",
    )
    mode: Literal["number", "expected"] = Field(
        default="number",
        description="number: parse the number the judge wrote. expected: the probability-"
        "weighted mean over the score values the judge could have written (G-Eval), from token "
        "logprobs; falls back to number where a backend returns none.",
    )
    judges: list[JudgeSpec] = Field(
        min_length=1,
        description="One judge, or several for an ensemble (backends, models or rubric phrasings).",
    )
    aggregate: Literal["mean", "median"] = Field(
        default="mean",
        description="How the ensemble's scores of one completion are combined (judges that "
        "gave no score are left out).",
    )
    require_logprobs: bool = Field(
        default=True,
        description="In expected mode, stop before training when a judge's start-up reply "
        "(check_at_start) comes without token log-probabilities, instead of scoring every "
        "completion from the written number; false accepts the written numbers.",
    )
    cache: bool = Field(
        default=True,
        description="Keep judge scores in a SQLite cache so the same completion is never "
        "judged twice (eval, resume, rewards check).",
    )
    max_parse_failure_rate: float = Field(
        default=0.2,
        ge=0.0,
        le=1.0,
        description="Warn (in `rewards check` and in the training log) when more than this "
        "share of one call's judge replies held no score (judge/parse_failure_rate), with an "
        "example reply: the rubric, max_tokens or the judge model needs fixing.",
    )
    cache_path: str | None = Field(
        default=None,
        description="Where the cache lives, relative to the config file. Default: "
        "judge_cache.sqlite in the run directory, else in the grpokit cache directory.",
    )

    @model_validator(mode="after")
    def _rubric_given(self) -> JudgeParams:
        if self.rubric is not None and self.rubric_file is not None:
            raise ValueError("give either rubric or rubric_file, not both")
        if self.group_rubric is not None and self.group_rubric_file is not None:
            raise ValueError("give either group_rubric or group_rubric_file, not both")
        _check_range(self.score_range)
        if self.scoring == "group":
            if self.group_rubric is None and self.group_rubric_file is None:
                raise ValueError(
                    "scoring: group shows the judge all answers to a prompt at once: set "
                    "group_rubric (an inline template with {completions}) or group_rubric_file"
                )
            own = [str(i) for i, j in enumerate(self.judges) if j.rubric or j.rubric_file]
            if own:
                raise ValueError(
                    f"judges {', '.join(own)} have their own rubric, which scoring: group does "
                    "not use (every judge is asked the group_rubric): remove it, or use "
                    "scoring: absolute"
                )
        elif self.rubric is None and self.rubric_file is None:
            missing = [
                str(i)
                for i, judge in enumerate(self.judges)
                if judge.rubric is None and judge.rubric_file is None
            ]
            if missing:
                raise ValueError(
                    "no rubric: set rubric (inline template) or rubric_file on the entry, or on "
                    f"every judge (judges {', '.join(missing)} have none)"
                )
        labels = [j.name if j.name is not None else str(i) for i, j in enumerate(self.judges)]
        if len(set(labels)) != len(labels):
            raise ValueError(f"judge names must be unique, got {labels}")
        return self
