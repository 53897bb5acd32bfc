"""Reading a YAML config: line numbers for every error, --set overrides, one message per problem;
then what a run reads with it (its prompt rows) and checks against this machine."""

from __future__ import annotations

import difflib
import importlib.util
import json
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ValidationError,
)

from grpokit.config.root import GRPOKitConfig
from grpokit.config.training import TrainingConfig
from grpokit.data.prompts import PromptRow, load_prompts
from grpokit.errors import UserError, read_utf8
from grpokit.rewards.spec import RewardSpec, parse_reward_specs
from grpokit.trl_fields import TRL_FIELDS, TRL_SCRIPT_KEYS


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


def _yaml_float(text: str) -> float:
    """The value of a YAML 1.1 float scalar (.inf, -.Inf, .nan, 1.0e+400 ...)."""
    t = text.lower().replace("_", "")
    if t.lstrip("+-") == ".inf":
        return -math.inf if t.startswith("-") else math.inf
    if t == ".nan":
        return math.nan
    try:
        return float(t)
    except ValueError:  # sexagesimal 1:30.5, finite
        return 0.0


_NEVER = {
    "training.save_minutes": "to never checkpoint by time, write save_minutes: 0 (0 turns it off)",
}
"""Settings where an infinite value would mean "never", and what to write for that instead."""


def _not_finite(where: str, value: str) -> str:
    """'<value> is not a finite number; <what to write instead>' for the setting ``where``."""
    hint = _NEVER.get(where) if value.lstrip("+").startswith(".inf") else None
    return f"{value} is not a finite number; {hint or 'give a finite value'}"


def _check_document(node: yaml.Node, source: Path, path: tuple[Any, ...] = ()) -> None:
    """Refuse what PyYAML accepts silently: a key given twice in a mapping (the last would win)
    and a number that is not finite (.inf, .nan)."""
    if isinstance(node, yaml.MappingNode):
        first: dict[Any, int] = {}
        for key, value in node.value:
            line = key.start_mark.line + 1
            if key.value in first and key.value != "<<":
                where = ".".join(str(x) for x in (*path, key.value))
                raise UserError(
                    f"{source}:{line}: {where} is given twice (also on line {first[key.value]}); "
                    "keep one"
                )
            first[key.value] = line
            _check_document(value, source, (*path, key.value))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_document(item, source, (*path, i))
    elif node.tag == "tag:yaml.org,2002:float" and not math.isfinite(_yaml_float(node.value)):
        where = ".".join(str(x) for x in path) or "(top level)"
        line = node.start_mark.line + 1
        raise UserError(f"{source}:{line}: {where}: {_not_finite(where, node.value)}")


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise UserError(f"--set {item!r}: expected key=value, e.g. --set training.beta=0.04")
    key, raw = item.split("=", 1)
    keys = key.strip().split(".")
    if not all(k.strip() for k in keys):
        raise UserError(f"--set {item!r}: an empty key; write e.g. --set training.beta=0.04")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"--set {item!r}: {_not_finite(key.strip(), raw.strip())}")
    return keys, value


def _apply_override(data: dict[str, Any], keys: list[str], value: Any, item: str) -> None:
    """Put ``value`` at the dotted ``keys`` (list items by index), creating missing sections."""
    node: Any = data
    for depth, key in enumerate(keys):
        where = ".".join(keys[:depth]) or "the config"
        last = depth == len(keys) - 1
        if isinstance(node, dict):
            if last:
                node[key] = value
            else:
                node = node.setdefault(key, {})
        elif isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise UserError(
                    f"--set {item!r}: {where} is a list of {len(node)}; '{key}' is not one of "
                    f"its indexes (0 to {len(node) - 1})"
                )
            if last:
                node[int(key)] = value
            else:
                node = node[int(key)]
        else:
            raise UserError(
                f"--set {item!r}: {where} is a value ({node!r}), not a section; it has no "
                f"key '{key}'"
            )


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


def _unknown_key(loc: tuple[Any, ...]) -> str:
    """Why a key is not accepted: a TRL field grpokit refuses, a TRL key that belongs elsewhere,
    or a misspelling."""
    key, section = str(loc[-1]), loc[:-1]
    if section == ("training",) and key in TRL_FIELDS:
        return TRL_FIELDS[key].refusal()
    if section in ((), ("training",)) and key in TRL_SCRIPT_KEYS:
        return f"a TRL script argument; in grpokit it is {TRL_SCRIPT_KEYS[key]}"
    if section == () and (key in TrainingConfig.model_fields or key in TRL_FIELDS):
        return "a training setting: put it under training:"
    close = difflib.get_close_matches(key, _field_names_at(section), n=1)
    return "unknown key" + (f"; did you mean {close[0]!r}?" if close else "; check the spelling")


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
            msg = _unknown_key(loc)
        out.append(f"{prefix}{where}: {msg}")
    return "\n".join(out)


def read_config_data(path: Path) -> tuple[dict[str, Any], dict[tuple[Any, ...], int]]:
    """The YAML mapping of a config file and the line of each key path; the file's problems
    (not UTF-8, not YAML, duplicate keys, non-finite numbers) as one UserError."""
    if not path.is_file():
        raise UserError(f"config file {path} does not exist")
    text = read_utf8(path)
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise UserError(f"{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict) or node is None:
        raise UserError(f"{path}: expected a mapping with model:, data:, rewards:, training:")
    _check_document(node, path)
    return data, _line_map(node)


def validate_config(
    data: dict[str, Any],
    path: Path,
    lines: dict[tuple[Any, ...], int],
    overrides: list[str] | None = None,
    *,
    config_dir: Path | None = None,
) -> GRPOKitConfig:
    """The config from a file's YAML mapping and --set overrides. Relative paths resolve
    against ``config_dir``, by default the file's directory."""
    for item in overrides or []:
        keys, value = _parse_override(item)
        _apply_override(data, keys, value, item)
    base = config_dir if config_dir is not None else path.resolve().parent
    try:
        cfg = GRPOKitConfig.model_validate(data, context={"config_dir": base})
    except ValidationError as e:
        raise UserError(format_validation_error(e, str(path), lines)) from None
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
    cfg._config_path = path.resolve()
    return cfg


def run_config_dir(path: Path) -> Path | None:
    """For a run directory's config.yaml: the directory its relative paths were written against
    (the original config's, recorded in the run's run.json), else None."""
    info = path.parent / "run.json"
    if path.name != "config.yaml" or not info.is_file():
        return None
    try:
        config_dir = json.loads(info.read_text(encoding="utf-8")).get("config_dir")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    return Path(config_dir) if isinstance(config_dir, str) and config_dir else None


def load_config(path: str | Path, overrides: list[str] | None = None) -> GRPOKitConfig:
    """Read and validate a YAML config; errors become one UserError naming file, line and field.

    A run directory's config.yaml resolves its relative paths (reward files, data) against the
    original config's directory, as when the run started (see :func:`run_config_dir`)."""
    path = Path(path)
    data, lines = read_config_data(path)
    return validate_config(data, path, lines, overrides, config_dir=run_config_dir(path))


def load_prompt_rows(cfg: GRPOKitConfig, which: Literal["train", "heldout"]) -> list[PromptRow]:
    """The training or held-out prompt rows of ``cfg``, read as data.train / data.heldout say
    (relative paths against the config's directory); a problem with the data is a UserError."""
    return load_prompts(
        cfg.data.source(which),
        prompt_column=cfg.data.prompt_column,
        columns=cfg.data.columns,
        base_dir=cfg.config_dir,
    )


def check_machine(cfg: GRPOKitConfig) -> None:
    """Fail before any loading when this machine cannot run ``cfg``: model.device names
    hardware it lacks, or training.optim needs a package it lacks. Loading a config checks
    neither, so that a config written for a GPU machine still loads elsewhere."""
    cfg.model.check_device()
    if cfg.training.adamw_8bit and importlib.util.find_spec("bitsandbytes") is None:
        raise UserError(
            f"training.optim: {cfg.training.optim} needs bitsandbytes "
            "(pip install bitsandbytes); or use adamw_torch_fused"
        )


def load_reward_specs(path: Path) -> tuple[list[RewardSpec], Path]:
    """The reward specs of a config file and the directory their relative paths resolve against.

    A full grpokit config is read with :func:`load_config`; a YAML holding only a ``rewards:``
    list is accepted too, to try rewards before the rest of the config exists.
    """
    # The reader `rewards check` reads completions with, so both files' encoding errors read
    # alike; imported here since it brings the rewards' scoring (torch) that loading skips.
    from grpokit.rewards.audit.common import read_utf8 as read_rewards_file

    if not path.is_file():
        raise UserError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(read_rewards_file(path))
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {exc}") from None
    if isinstance(data, dict) and set(data) == {"rewards"}:
        return parse_reward_specs(data["rewards"], source=str(path)), path.resolve().parent
    cfg = load_config(path)
    return list(cfg.rewards), cfg.config_dir
