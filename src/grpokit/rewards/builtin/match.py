"""``regex_match`` and ``json_schema``: rewards for answers with a checkable shape."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from grpokit.errors import UserError
from grpokit.rewards._base import Reward
from grpokit.rewards.builtin.format import strip_code_fences
from grpokit.rewards.registry import BuildContext, register_reward
from grpokit.rewards.text import completion_text

_FLAGS: dict[str, re.RegexFlag] = {
    "IGNORECASE": re.IGNORECASE,
    "MULTILINE": re.MULTILINE,
    "DOTALL": re.DOTALL,
}


class RegexMatchParams(BaseModel):
    """Parameters of ``regex_match``."""

    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(description="A Python regular expression (re module syntax).")
    mode: Literal["search", "fullmatch"] = Field(
        default="search",
        description="`search`: the pattern occurs somewhere; `fullmatch`: the whole completion "
        "(stripped of surrounding whitespace) matches it.",
    )
    flags: list[Literal["IGNORECASE", "MULTILINE", "DOTALL"]] = Field(
        default_factory=list, description="re flags to compile the pattern with."
    )
    match_score: float = Field(default=1.0, description="Reward when the pattern matches.")
    no_match_score: float = Field(default=0.0, description="Reward when it does not.")

    _compiled: re.Pattern[str] = PrivateAttr()

    @model_validator(mode="after")
    def _compile(self) -> RegexMatchParams:
        flags = 0
        for flag in self.flags:
            flags |= _FLAGS[flag]
        try:
            self._compiled = re.compile(self.pattern, flags)
        except re.error as exc:
            raise ValueError(
                f"pattern {self.pattern!r} is not a valid regular expression: {exc}"
            ) from None
        return self

    @property
    def compiled(self) -> re.Pattern[str]:
        """The compiled pattern."""
        return self._compiled


class RegexMatch(Reward):
    """The ``regex_match`` reward (see :func:`regex_match`)."""

    def __init__(self, params: RegexMatchParams, name: str = "regex_match") -> None:
        super().__init__(name)
        self.params = params

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[float | None]:
        pattern, p = self.params.compiled, self.params
        scores: list[float | None] = []
        for completion in completions:
            text = completion_text(completion)
            if p.mode == "fullmatch":
                hit = pattern.fullmatch(text.strip()) is not None
            else:
                hit = pattern.search(text) is not None
            scores.append(p.match_score if hit else p.no_match_score)
        return scores


def regex_match(
    pattern: str,
    *,
    mode: Literal["search", "fullmatch"] = "search",
    flags: list[Literal["IGNORECASE", "MULTILINE", "DOTALL"]] | None = None,
    match_score: float = 1.0,
    no_match_score: float = 0.0,
) -> RegexMatch:
    """``match_score`` where the regular expression matches the completion, else ``no_match_score``.

    YAML: ``- {type: regex_match, pattern: '^Answer: \\d+$', mode: fullmatch}``.

    >>> reward = regex_match(r"Answer: \\d+$", mode="fullmatch")
    >>> reward(prompts=None, completions=["Answer: 42", "Answer: 42!", "The answer: 42"])
    [1.0, 0.0, 0.0]
    """
    return RegexMatch(
        RegexMatchParams(
            pattern=pattern,
            mode=mode,
            flags=list(flags or []),
            match_score=match_score,
            no_match_score=no_match_score,
        )
    )


register_reward(
    "regex_match",
    RegexMatchParams,
    lambda params, ctx: RegexMatch(params),
    # The best value depends on match_score; 1.0 is the default and the usual case.
    max_value=1.0,
)


class JsonSchemaParams(BaseModel):
    """Parameters of ``json_schema``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_schema: dict[str, Any] | None = Field(
        default=None,
        alias="schema",
        description="The JSON Schema (draft 2020-12 unless it says `$schema`) written inline.",
    )
    schema_file: str | None = Field(
        default=None,
        description="Path of a JSON file holding the schema, relative to the config file.",
    )
    partial_credit: bool = Field(
        default=False,
        description="If true, JSON that parses but does not match scores 0.25 + 0.5 x (share of "
        "the schema's top-level `properties` present and valid); if false it scores 0.0.",
    )
    allow_surrounding_text: bool = Field(
        default=False,
        description="If true, the first JSON object or array found in the completion is checked "
        "(text around it is ignored); if false the completion (less a code fence around it) "
        "must be exactly one JSON value.",
    )

    @model_validator(mode="after")
    def _one_schema(self) -> JsonSchemaParams:
        if (self.json_schema is None) == (self.schema_file is None):
            raise ValueError("give exactly one of `schema` (inline) or `schema_file`")
        return self

    @field_validator("json_schema")
    @classmethod
    def _check_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is not None:
            try:
                _validator_class(schema).check_schema(schema)
            except Exception as exc:
                raise ValueError(f"not a valid JSON Schema: {exc}") from None
        return schema


def _validator_class(schema: dict[str, Any]) -> Any:
    try:
        import jsonschema
    except ImportError as exc:  # pragma: no cover - jsonschema is a dependency
        raise UserError("the json_schema reward needs the `jsonschema` package") from exc
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


def extract_json(text: str, allow_surrounding_text: bool) -> tuple[bool, Any]:
    """``(found, value)``: the completion's JSON value, or ``(False, None)``.

    >>> extract_json('```json\\n{"a": 1}\\n```', False)
    (True, {'a': 1})
    >>> extract_json('Here: {"a": 1} done', True)
    (True, {'a': 1})
    """
    body = strip_code_fences(text)
    try:
        return True, json.loads(body)
    except ValueError:
        pass
    if not allow_surrounding_text:
        return False, None
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[\[{]", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        return True, value
    return False, None


class JsonSchema(Reward):
    """The ``json_schema`` reward (see :func:`json_schema`)."""

    def __init__(
        self, params: JsonSchemaParams, schema: dict[str, Any], name: str = "json_schema"
    ) -> None:
        super().__init__(name)
        self.params = params
        self.schema = schema
        validator_class = _validator_class(schema)
        validator_class.check_schema(schema)
        self._validator = validator_class(schema)
        properties = schema.get("properties")
        self._properties: dict[str, Any] = properties if isinstance(properties, dict) else {}
        self._property_validators = {
            key: validator_class(sub)
            for key, sub in self._properties.items()
            if isinstance(sub, (dict, bool))
        }

    def score_one(self, text: str) -> float:
        """Score one completion text."""
        found, value = extract_json(text, self.params.allow_surrounding_text)
        if not found:
            return 0.0
        if self._validator.is_valid(value):
            return 1.0
        if not self.params.partial_credit:
            return 0.0
        share = 0.0
        if isinstance(value, dict) and self._property_validators:
            good = sum(
                1
                for key, validator in self._property_validators.items()
                if key in value and validator.is_valid(value[key])
            )
            share = good / len(self._property_validators)
        return 0.25 + 0.5 * share

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[float | None]:
        return [self.score_one(completion_text(c)) for c in completions]


def _load_schema(params: JsonSchemaParams, base_dir: Path) -> dict[str, Any]:
    if params.json_schema is not None:
        return params.json_schema
    assert params.schema_file is not None
    path = (base_dir / params.schema_file).resolve()
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"json_schema: schema_file {path} does not exist") from None
    except ValueError as exc:
        raise UserError(f"json_schema: schema_file {path} is not valid JSON: {exc}") from None
    if not isinstance(loaded, dict):
        raise UserError(f"json_schema: schema_file {path} must hold a JSON object")
    try:
        _validator_class(loaded).check_schema(loaded)
    except Exception as exc:
        raise UserError(
            f"json_schema: schema_file {path} is not a valid JSON Schema: {exc}"
        ) from None
    return loaded


def json_schema(
    schema: dict[str, Any],
    *,
    partial_credit: bool = False,
    allow_surrounding_text: bool = False,
) -> JsonSchema:
    """1.0 for a completion that is JSON valid against ``schema``; 0.0 otherwise, or with
    ``partial_credit`` 0.25 + 0.5 x (share of top-level properties right) for JSON that parses.

    YAML: ``- {type: json_schema, schema_file: answer.schema.json, partial_credit: true}``.

    >>> schema = {"type": "object", "required": ["name", "age"],
    ...           "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    >>> reward = json_schema(schema, partial_credit=True)
    >>> reward(prompts=None, completions=['{"name": "Ann", "age": 3}', '{"name": "Ann"}', 'Ann, 3'])
    [1.0, 0.5, 0.0]
    """
    params = JsonSchemaParams.model_validate(
        {
            "schema": schema,
            "partial_credit": partial_credit,
            "allow_surrounding_text": allow_surrounding_text,
        }
    )
    return JsonSchema(params, schema)


def _build_json_schema(params: JsonSchemaParams, ctx: BuildContext) -> JsonSchema:
    return JsonSchema(params, _load_schema(params, ctx.base_dir))


register_reward("json_schema", JsonSchemaParams, _build_json_schema, max_value=1.0)
