"""Rubric templates: the judge prompt with {prompt}, {completion} and dataset columns."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from grpokit.errors import UserError

# {name} is a placeholder; {{ and }} are literal braces. Anything else (a lone brace, JSON in
# an example) is left as written, so rubrics need no escaping unless they mean {name} literally.
_TOKEN_RE = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class Rubric:
    """A judge prompt template and where it came from (for error messages)."""

    template: str
    source: str
    """"rubric" (inline), or the file path."""

    @property
    def placeholders(self) -> frozenset[str]:
        """Names used as {name} in the template."""
        return frozenset(m.group(1) for m in _TOKEN_RE.finditer(self.template) if m.group(1))

    @property
    def digest(self) -> str:
        """A hash of the template, part of the cache key."""
        return hashlib.sha256(self.template.encode("utf-8")).hexdigest()[:16]

    def render(self, prompt: str, completion: str, columns: Mapping[str, object]) -> str:
        """The judge prompt for one completion.

        Raises :class:`UserError` naming the placeholder when a column the template uses is
        not in the batch.
        """
        values: dict[str, object] = dict(columns)
        values["prompt"] = prompt
        values["completion"] = completion

        def substitute(match: re.Match[str]) -> str:
            token = match.group(0)
            if token == "{{":
                return "{"
            if token == "}}":
                return "}"
            name = match.group(1)
            if name not in values:
                available = ", ".join(sorted(values)) or "none"
                raise UserError(
                    f"{self.source}: the placeholder {{{name}}} is neither prompt, completion nor "
                    f"a dataset column (the batch has: {available}). Add the column to the "
                    f"dataset, or write {{{{{name}}}}} for literal braces."
                )
            return str(values[name])

        return _TOKEN_RE.sub(substitute, self.template)


def load_rubric(
    rubric: str | None,
    rubric_file: str | None,
    base_dir: Path,
    where: str,
    *,
    placeholder: str = "completion",
) -> Rubric:
    """Read an inline or file rubric and check it before any training starts.

    ``where`` names the config field for error messages (e.g. ``rewards[1].rubric_file``);
    ``placeholder`` is where the judged text goes, which the template must hold
    (``completions`` for a group rubric).
    """
    if rubric_file is not None:
        path = Path(rubric_file).expanduser()
        if not path.is_absolute():
            path = base_dir / path
        try:
            template = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UserError(
                f"{where}: rubric file {path} does not exist. Fix the path (relative to the "
                "config file) or write the rubric inline with rubric:."
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"{where}: cannot read rubric file {path}: {exc}") from exc
        result = Rubric(template=template, source=str(path))
    elif rubric is not None:
        result = Rubric(template=rubric, source=where)
    else:
        raise UserError(f"{where}: no rubric given; set rubric or rubric_file.")
    if not result.template.strip():
        raise UserError(f"{result.source}: the rubric is empty.")
    if placeholder not in result.placeholders:
        raise UserError(
            f"{result.source}: the rubric has no {{{placeholder}}} placeholder, so the judge "
            f"would never see the text it scores. Put {{{placeholder}}} where the answer"
            f"{'s go' if placeholder == 'completions' else ' goes'}."
        )
    return result
