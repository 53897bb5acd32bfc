"""TRL's and transformers' ways of writing ``training:`` settings, read as grpokit's.

A TRL user's GRPOConfig (or a dump of one) loads as written: :func:`from_trl_forms` turns its
older, renamed and shorthand forms into the one form each grpokit field takes, before the
fields check their values. What it cannot translate it leaves for the field's own check, whose
message names the line.
"""

from __future__ import annotations

from typing import Any

from grpokit.trl_fields import drop_accepted_trl_fields

_FSDP_OPTIONS = ("full_shard", "shard_grad_op", "offload", "auto_wrap")


def legacy_fsdp(value: str) -> dict[str, bool]:
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


def from_trl_forms(data: dict[str, Any]) -> dict[str, Any]:
    """The ``training:`` mapping ``data`` with TRL's and transformers' forms written as grpokit's
    fields take them (a new mapping; ``data`` is left as it is):

    - TRL fields that change nothing in grpokit, given at a value it accepts, are dropped
      (:mod:`grpokit.trl_fields`); a refused value stays, for the check that names its line;
    - activation_checkpointing, transformers 5's name, sets gradient_checkpointing;
    - fsdp: null is transformers' "off" (false); fsdp_config: null is no settings (defaults);
    - warmup_steps below 1 is transformers 5's share of the run, grpokit's warmup_ratio;
    - eval_steps alone turns the periodic eval on, as it did before eval_strategy existed;
    - scale_rewards: true / false, TRL's form before it took a string, is "group" / "none";
    - a legacy fsdp string ("full_shard offload") turns FSDP on and sets fsdp_config as
      TrainingArguments does for FSDP2; an explicit fsdp_config key wins, as in transformers.

    Raises ValueError where two forms of one setting disagree.
    """
    data = drop_accepted_trl_fields(data)  # a copy, which the steps below edit in place
    _activation_checkpointing(data)
    if "fsdp" in data and data["fsdp"] is None:
        data["fsdp"] = False
    if "fsdp_config" in data and data["fsdp_config"] is None:
        del data["fsdp_config"]
    _warmup_share(data)
    if "eval_strategy" not in data and data.get("eval_steps"):
        data["eval_strategy"] = "steps"
    if isinstance(data.get("scale_rewards"), bool):
        data["scale_rewards"] = "group" if data["scale_rewards"] else "none"
    if isinstance(data.get("fsdp"), str):
        _fsdp_string(data)
    return data


def _activation_checkpointing(data: dict[str, Any]) -> None:
    renamed = data.get("activation_checkpointing")
    if renamed is not None:
        if data.get("gradient_checkpointing") not in (None, renamed):
            raise ValueError(
                "activation_checkpointing and gradient_checkpointing (its older name) differ; "
                "set one"
            )
        data["gradient_checkpointing"] = renamed


def _warmup_share(data: dict[str, Any]) -> None:
    warmup = data.get("warmup_steps")
    if isinstance(warmup, float) and 0 < warmup < 1:
        if data.get("warmup_ratio"):
            raise ValueError(
                "warmup_steps below 1 is a share of the run, as warmup_ratio is; set one"
            )
        data["warmup_ratio"], data["warmup_steps"] = warmup, 0


def _fsdp_string(data: dict[str, Any]) -> None:
    try:
        settings = legacy_fsdp(data["fsdp"])
    except ValueError:
        return  # left for the fsdp field's own check, which names its line
    explicit = data.get("fsdp_config")
    data["fsdp_config"] = (
        settings | explicit if isinstance(explicit, dict) else explicit or settings
    )
    data["fsdp"] = bool(data["fsdp"].split())
