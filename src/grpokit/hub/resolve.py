"""Where a model's files are, and its tokenizer: the converted directory of the embedded default,
of a named offline model or of a GGUF file, a local directory, or a hub name. Below everything
that loads a model (the policy in :mod:`grpokit.models`, a reward model, a local judge), so that
each finds models the same way.
"""

from __future__ import annotations

import re
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from grpokit.errors import UserError
from grpokit.hub.convert import gguf_model_dir
from grpokit.hub.embedded import EMBEDDED_MODEL, embedded_model_dir
from grpokit.hub.named import NAMED_MODELS, named_model, named_model_dir

# A hub id is "name" or "owner/name" made of these characters; anything else is a local path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def resolve_model_path(name_or_path: str) -> str:
    """Where to load a model from.

    The embedded name, a named offline model (:data:`~grpokit.hub.named.NAMED_MODELS`)
    and a ``.gguf`` file give their converted cache directory (converting on first use); an
    existing local directory is returned as is; a string shaped like a hub id (``owner/name``) is
    passed through for transformers to fetch. Anything else raises :class:`UserError`.
    """
    name = name_or_path.strip()
    if name.lower() == EMBEDDED_MODEL:
        return str(embedded_model_dir())
    named = named_model(name)
    if named is not None:
        return str(named_model_dir(named))
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(
                f"Model directory '{name_or_path}' has no config.json: it is not a Hugging Face "
                "model directory. Point the model at a directory written by save_pretrained "
                f"(or a grpokit checkpoint), or use the embedded default '{EMBEDDED_MODEL}'."
            )
        return str(path)
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return str(gguf_model_dir(path))
        raise UserError(
            f"Model '{name_or_path}' is a file but not a .gguf; give a GGUF file, a model "
            f"directory (with config.json), a hub name, or a named model ({_names()})."
        )
    if name.startswith((".", "/", "~")) or not _HUB_ID.match(name):
        raise UserError(
            f"Model '{name_or_path}' does not exist: no such directory or file, and it is not a "
            f"hub name (owner/name). Check the path, or use a named model ({_names()})."
        )
    return name


def _names() -> str:
    return ", ".join(NAMED_MODELS) + "; `grpokit models` lists them"


def hub_error(name_or_path: str, exc: Exception) -> UserError:
    """The error for a model transformers could not load from ``name_or_path``."""
    return UserError(
        f"Could not load model '{name_or_path}': {exc}. It is neither a local directory nor "
        "loadable from the Hugging Face hub (is the hub reachable, the name right?). Use a local "
        f"model directory or the embedded default '{EMBEDDED_MODEL}'."
    )


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """The tokenizer for a model, with a pad token (the EOS token when it has none).

    Padding side is left as the tokenizer has it; callers that pad choose their side.
    """
    from transformers import AutoTokenizer

    # A tokenizer saved on its own (beside a LoRA adapter) is a tokenizer directory too.
    given = Path(name_or_path).expanduser()
    has_own = (given / "tokenizer_config.json").is_file()
    resolved = str(given) if has_own else resolve_model_path(name_or_path)
    try:
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(resolved)
    except (OSError, ValueError) as exc:
        raise hub_error(name_or_path, exc) from exc
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise UserError(
                f"The tokenizer of '{name_or_path}' has neither a pad nor an EOS token; grpokit "
                "needs an EOS token to end completions. Add one to its tokenizer_config.json."
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id that pads batches: the tokenizer's pad token, else its EOS token (the rule
    :func:`load_tokenizer` applies when it loads a tokenizer without a pad token)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise UserError("the tokenizer has neither a pad nor an EOS token; grpokit needs one")
    return int(pad)
