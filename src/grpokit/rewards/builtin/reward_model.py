"""``reward_model``: scores from a trained Hugging Face sequence-classification checkpoint.

What TRL's GRPOTrainer does with a model name in ``reward_funcs``: each prompt and completion
become one text (chat prompts through the reward model's own chat template, prompt messages then
completion messages; plain strings concatenated), tokenized without added special tokens and
padded on the right with the tokenizer's pad token (its EOS token when it has none, written into
the model's config too, since the model reads its score at the last non-pad token). The score is
the classifier's first logit, ``logits[:, 0]``.

The model is loaded once, when the reward set is built, and scores ``batch_size`` texts per
forward pass, longest first so that texts of similar length share a batch.

Reward models learned from human preferences inherit their biases: longer answers and some
phrasings score higher whatever they say. ``grpokit judge audit-reward-model`` measures that on
your own completions before you train on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from grpokit.errors import UserError
from grpokit.rewards._base import Reward, RewardBatch, RewardResult
from grpokit.rewards.registry import BuildContext, register_reward
from grpokit.rewards.text import completion_text

if TYPE_CHECKING:
    import torch

# torch is imported by the functions that compute: registering this type (which every config's
# validation does) stays free of it, so a config error is reported before seconds of imports.

Normalize = Literal["none", "batch"]

# A tokenizer's model_max_length at or above this is transformers' "no limit" placeholder.
_NO_TOKENIZER_LIMIT = 10**9


class RewardModelParams(BaseModel):
    """Parameters of ``reward_model``."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        description="The reward model: a directory written by save_pretrained (relative paths "
        "start at the config file's directory) or a hub name, holding a trained "
        "sequence-classification model (AutoModelForSequenceClassification) and its tokenizer, "
        "as a model name in TRL's reward_funcs."
    )
    label_index: int = Field(
        default=0,
        ge=0,
        description="Which logit is the score. 0, as TRL (a reward model has one); for a "
        "classifier with several labels, the index of the label to reward.",
    )
    batch_size: int = Field(
        default=16,
        ge=1,
        description="Texts scored in one forward pass. Scores do not depend on it; memory does.",
    )
    device: str = Field(
        default="auto",
        pattern=r"^(auto|cpu|mps|cuda(:\d+)?)$",
        description="Where the reward model runs: auto (cuda when present, else cpu), cpu, "
        "cuda or cuda:N. auto and cuda mean the process's current CUDA device, so each "
        "data-parallel process scores on its own GPU.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="Weights' dtype; auto is bfloat16 on cuda and float32 elsewhere. Scores are "
        "returned as float32 values whatever the dtype.",
    )
    max_length: int | None = Field(
        default=None,
        ge=1,
        description="Most tokens of prompt + completion the model reads; a longer text loses "
        "its beginning (the score is read at its last token, so the end of the completion is "
        "kept). Default: the model's own limit (max_position_embeddings, or the tokenizer's "
        "model_max_length when smaller). The share of truncated texts is logged as "
        "reward_model/truncated_frac.",
    )
    normalize: Normalize = Field(
        default="none",
        description="`none`: the raw score. `batch`: a z-score within each scoring call (the "
        "step's completions on this process): minus the batch mean, divided by the batch's "
        "population std (all zeros when every score is equal), so its scale no longer depends "
        "on the model and `weight` sets its share of the total. Applied before scale and shift; "
        "the raw mean and std are logged as reward_model/raw_mean and /raw_std.",
    )
    scale: float = Field(
        default=1.0,
        gt=0,
        description="Multiplies the (normalised) score: a fixed rescaling, e.g. 1/std measured "
        "with `grpokit judge audit-reward-model`. Positive, so the ranking of completions is "
        "kept; use a negative weight to invert a reward.",
    )
    shift: float = Field(
        default=0.0,
        description="Added after scale: reward = scale * score + shift (e.g. minus the mean "
        "score of typical answers, so that they get about 0).",
    )


# ---- pure pieces ---------------------------------------------------------------------------------


def normalise_scores(
    raw: torch.Tensor, normalize: Normalize, scale: float = 1.0, shift: float = 0.0
) -> torch.Tensor:
    """The reward from raw scores: optionally z-scored in the batch, then ``scale * x + shift``.

    raw: (B,) -> (B,), same dtype. ``batch`` uses the population std; a batch without spread
    (or of one) gives zeros before the shift.

    >>> import torch
    >>> normalise_scores(torch.tensor([1.0, 3.0]), "batch", scale=2.0, shift=1.0).tolist()
    [-1.0, 3.0]
    """
    import torch

    values = raw
    if normalize == "batch" and raw.numel() > 0:
        centred = raw - raw.mean()
        std = raw.std(unbiased=False)
        values = centred / std if std > 0 else torch.zeros_like(raw)
    return values * scale + shift


def is_chat(prompt: Any) -> bool:
    """Whether a prompt is a list of chat messages (TRL's conversational format)."""
    return (
        isinstance(prompt, Sequence)
        and not isinstance(prompt, (str, bytes))
        and len(prompt) > 0
        and all(isinstance(m, Mapping) and "role" in m for m in prompt)
    )


def completion_messages(completion: Any) -> list[dict[str, Any]]:
    """A completion as chat messages: messages stay as they are, text becomes one assistant
    message (``rewards check`` files may pair a chat prompt with a string completion)."""
    if isinstance(completion, Mapping) and "role" in completion:
        return [dict(completion)]
    if is_chat(completion):
        return [dict(m) for m in completion]
    return [{"role": "assistant", "content": completion_text(completion)}]


def render_text(tokenizer: Any, prompt: Any, completion: Any) -> str:
    """The text the reward model reads for one prompt and completion, as TRL builds it.

    A chat prompt and its completion go through the tokenizer's chat template as one
    conversation (no generation prompt); otherwise prompt and completion text are concatenated
    (a missing prompt counts as empty).
    """
    if is_chat(prompt):
        messages = [dict(m) for m in prompt] + completion_messages(completion)
        return cast(str, tokenizer.apply_chat_template(messages, tokenize=False))
    prefix = "" if prompt is None else completion_text(prompt)
    return prefix + completion_text(completion)


def pad_right(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``attention_mask``, both (len(rows), longest) long."""
    import torch

    width = max((len(r) for r in rows), default=0)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(list(ids), dtype=torch.long)
        attention[i, : len(ids)] = 1
    return input_ids, attention


# ---- loading -------------------------------------------------------------------------------------


def pick_device(name: str, where: str) -> torch.device:
    """The torch device for ``device: auto|cpu|mps|cuda|cuda:N``; one that this machine lacks
    is a :class:`UserError` naming the field."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index is not None and device.index >= count):
            raise UserError(
                f"{where}.device: {name} is not available on this machine ({count} CUDA "
                "device(s)); use auto, cpu, or an existing cuda:N."
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"{where}.device: mps is not available on this machine; use auto or cpu.")
    return device


def resolve_reward_model(model: str, base_dir: Path, where: str) -> str:
    """Where to load the reward model from: a directory (relative to ``base_dir``) or a hub
    name ``owner/name``; anything else is a :class:`UserError` naming the field (a bare name is
    taken for a mistyped directory rather than sent to the hub)."""
    from grpokit.hub.embedded import EMBEDDED_MODEL
    from grpokit.hub.resolve import resolve_model_path

    path = Path(model).expanduser()
    local = path if path.is_absolute() else base_dir / path
    missing = UserError(
        f"{where}.model: {local} does not exist. Give the directory of a trained "
        "sequence-classification model (relative paths start at the config file's directory) "
        "or a hub name (owner/name)."
    )
    bare = "/" not in model.strip("/") and model.strip().lower() != EMBEDDED_MODEL
    if not local.exists() and bare:
        raise missing
    try:
        return resolve_model_path(str(local) if local.exists() else model)
    except UserError as exc:
        if local.exists():  # a file, or a directory without config.json
            raise UserError(f"{where}.model: {exc}") from None
        raise missing from None


def load_reward_model(
    model: str, base_dir: Path, device: torch.device, dtype_name: str, where: str
) -> tuple[Any, Any]:
    """The reward model (eval mode, on ``device``) and its tokenizer, ready for batches: the
    tokenizer has a pad token and the model's config knows its id.

    Raises:
        UserError: a missing or unloadable model, or one without a trained classification head
            (a causal LM loaded as a classifier scores with a random head).
    """
    import torch
    from transformers import AutoModelForSequenceClassification

    from grpokit.hub.resolve import load_tokenizer

    resolved = resolve_reward_model(model, base_dir, where)
    if dtype_name == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, dtype_name)
    try:
        tokenizer: Any = load_tokenizer(resolved)
        loaded, info = AutoModelForSequenceClassification.from_pretrained(
            resolved, dtype=dtype, output_loading_info=True
        )
    except UserError as exc:
        raise UserError(f"{where}.model: {exc}") from None
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(
            f"{where}.model: cannot load {model!r} as a sequence-classification model ({exc}). "
            "Use a local directory written by save_pretrained (a hub name needs the hub)."
        ) from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise UserError(
            f"{where}.model: {model!r} has no trained classification head (missing weights: "
            f"{', '.join(missing[:4])}), so its scores would be random. Give a reward model "
            "(e.g. the output of TRL's RewardTrainer), not a base or causal language model."
        )
    reward_model: Any = loaded
    reward_model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    reward_model.to(device)
    reward_model.eval()
    reward_model.requires_grad_(False)
    return reward_model, tokenizer


def model_max_length(model: Any, tokenizer: Any) -> int | None:
    """The most tokens the model reads: its position limit, or the tokenizer's when smaller."""
    limits = [getattr(model.config.get_text_config(), "max_position_embeddings", None)]
    tokenizer_limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(tokenizer_limit, int) and tokenizer_limit < _NO_TOKENIZER_LIMIT:
        limits.append(tokenizer_limit)
    present = [int(v) for v in limits if isinstance(v, int) and v > 0]
    return min(present) if present else None


# ---- the reward ----------------------------------------------------------------------------------


class RewardModelReward(Reward):
    """The ``reward_model`` reward: loads the model at construction, scores every call with it.

    From Python: ``RewardModelReward(RewardModelParams(model="runs/rm", normalize="batch"))``
    (the factory-per-type convention cannot apply: ``reward_model`` names this module).

    Each call's result reports ``reward_model/truncated_frac`` in its metrics and, when the
    score is normalised or rescaled, the raw score's ``reward_model/raw_mean`` and ``/raw_std``.
    """

    def __init__(
        self,
        params: RewardModelParams,
        base_dir: Path | None = None,
        *,
        name: str = "reward_model",
        where: str = "reward_model",
    ) -> None:
        """Load the model. ``base_dir``: where a relative ``params.model`` starts (the config
        file's directory in YAML; default the current directory)."""
        super().__init__(name)
        self.params = params
        self.where = where
        self.device = pick_device(params.device, where)
        self.model: Any
        self.model, self.tokenizer = load_reward_model(
            params.model, base_dir or Path.cwd(), self.device, params.dtype, where
        )
        num_labels = int(self.model.config.num_labels)
        if params.label_index >= num_labels:
            raise UserError(
                f"{where}.label_index: {params.label_index} is out of range; the model has "
                f"{num_labels} label(s) (0 to {num_labels - 1})."
            )
        self.max_length = params.max_length or model_max_length(self.model, self.tokenizer)

    def encode(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[list[int]]:
        """Token ids of each rendered text, before truncation."""
        texts = []
        for prompt, completion in zip(prompts, completions, strict=True):
            if is_chat(prompt) and not getattr(self.tokenizer, "chat_template", None):
                raise UserError(
                    f"{self.where}.model: the prompts are chat messages, but the reward model's "
                    "tokenizer has no chat template to render them. Use string prompts, or a "
                    "reward model whose tokenizer has a chat template."
                )
            texts.append(render_text(self.tokenizer, prompt, completion))
        if not texts:
            return []
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return [list(row) for row in ids]

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Length of each text in the reward model's tokens (no special tokens added)."""
        if not texts:
            return []
        return [
            len(row) for row in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        ]

    def raw_scores(self, encoded: Sequence[Sequence[int]]) -> tuple[torch.Tensor, int]:
        """The model's score of each encoded text, (B,) float32 on cpu, and how many texts were
        truncated to ``max_length`` (their beginning dropped)."""
        import torch

        if self.model is None:
            raise RuntimeError(f"reward {self.__name__!r} was closed")
        limit = self.max_length
        rows = [list(r)[-limit:] if limit is not None else list(r) for r in encoded]
        truncated = sum(len(r) < len(e) for r, e in zip(rows, encoded, strict=True))
        pad_id = int(self.tokenizer.pad_token_id)
        # An empty prompt and completion without a template leave nothing to read: one pad
        # token, as TRL's padded batch would give it.
        rows = [r or [pad_id] for r in rows]
        # Longest first: similar lengths share a batch, and an out-of-memory error comes first.
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        scores = torch.empty(len(rows), dtype=torch.float32)
        size = self.params.batch_size
        for start in range(0, len(order), size):
            chunk = order[start : start + size]
            input_ids, attention = pad_right([rows[i] for i in chunk], pad_id)
            with torch.no_grad():
                logits = self.model(
                    input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device)
                ).logits
            scores[chunk] = logits[:, self.params.label_index].float().cpu()
        return scores, truncated

    def evaluate(self, batch: RewardBatch) -> RewardResult:
        p = self.params
        raw, truncated = self.raw_scores(self.encode(batch.prompts, batch.completions))
        values = normalise_scores(raw.double(), p.normalize, p.scale, p.shift)
        metrics = {"reward_model/truncated_frac": truncated / len(raw) if len(raw) else 0.0}
        if p.normalize != "none" or p.scale != 1.0 or p.shift != 0.0:
            metrics["reward_model/raw_mean"] = raw.mean().item() if len(raw) else math.nan
            metrics["reward_model/raw_std"] = (
                raw.std(unbiased=False).item() if len(raw) else math.nan
            )
        return RewardResult([float(v) for v in values.tolist()], metrics=metrics)

    def close(self) -> None:
        """Drop the model so its memory can be freed; the reward is unusable afterwards."""
        if self.model is not None:
            self.model = None
            if self.device.type == "cuda":
                import torch

                torch.cuda.empty_cache()


def build(params: RewardModelParams, ctx: BuildContext) -> RewardModelReward:
    """Registry builder for ``type: reward_model``: loads the model once per run."""
    return RewardModelReward(params, ctx.base_dir)


register_reward("reward_model", RewardModelParams, build, max_value=None)
