from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from grpokit.errors import UserError
from grpokit.rewards.judge.cache import CachedScore, JudgeCache, cache_key
from grpokit.rewards.judge.config import JudgeParams
from grpokit.rewards.judge.rubric import load_rubric

OPENAI = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}


def test_rubric_renders_prompt_completion_and_columns() -> None:
    rubric = load_rubric(
        'Topic: {prompt}\nAnswer: {completion}\nLevel: {level}\nJSON: {"score": 1} {{completion}}',
        None,
        Path("."),
        "rewards[1].rubric",
    )
    assert rubric.placeholders == {"prompt", "completion", "level"}
    text = rubric.render("T", "A", {"level": 3})
    assert text == 'Topic: T\nAnswer: A\nLevel: 3\nJSON: {"score": 1} {completion}'


def test_rubric_unknown_column_names_it() -> None:
    rubric = load_rubric("{completion} {audience}", None, Path("."), "rewards[1].rubric")
    with pytest.raises(UserError, match=r"\{audience\}.*the batch has: completion, prompt"):
        rubric.render("p", "c", {})


def test_rubric_without_completion_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "rubric.txt"
    path.write_text("Score the {prompt} from 0 to 1.", encoding="utf-8")
    with pytest.raises(UserError, match=r"rubric\.txt: the rubric has no \{completion\}"):
        load_rubric(None, "rubric.txt", tmp_path, "rewards[1].rubric_file")
    with pytest.raises(UserError, match=r"rewards\[1\]\.rubric: the rubric has no \{completion\}"):
        load_rubric("Score it", None, tmp_path, "rewards[1].rubric")


def test_missing_rubric_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"rewards\[0\]\.rubric_file: rubric file .*nope\.txt"):
        load_rubric(None, "nope.txt", tmp_path, "rewards[0].rubric_file")


def test_params_reject_inline_api_key() -> None:
    with pytest.raises(pydantic.ValidationError, match="api_key must not be written"):
        JudgeParams.model_validate(
            {"rubric": "{completion}", "judges": [{**OPENAI, "api_key": "sk-1"}]}
        )


def test_params_need_a_rubric_and_valid_range() -> None:
    with pytest.raises(pydantic.ValidationError, match="no rubric"):
        JudgeParams.model_validate({"judges": [OPENAI]})
    # A rubric on every judge is enough.
    JudgeParams.model_validate({"judges": [{**OPENAI, "rubric": "{completion}"}]})
    with pytest.raises(pydantic.ValidationError, match="low < high"):
        JudgeParams.model_validate(
            {"rubric": "{completion}", "score_range": [1, 1], "judges": [OPENAI]}
        )
    with pytest.raises(pydantic.ValidationError, match="unique"):
        JudgeParams.model_validate(
            {"rubric": "{completion}", "judges": [{**OPENAI, "name": "a"}, {**OPENAI, "name": "a"}]}
        )
    with pytest.raises(pydantic.ValidationError, match="Extra inputs"):
        JudgeParams.model_validate({"rubric": "{completion}", "judges": [OPENAI], "rubirc": "x"})


def test_params_every_field_is_described() -> None:
    from grpokit.rewards.judge.config import LocalJudge, OpenAIJudge

    for model in (JudgeParams, OpenAIJudge, LocalJudge):
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no description"


def test_cache_hits_are_keyed_and_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "judge.sqlite"
    key = cache_key("judge-a", "rubric-1", "number:0:1", "prompt text")
    assert key != cache_key("judge-b", "rubric-1", "number:0:1", "prompt text")
    assert key != cache_key("judge-a", "rubric-2", "number:0:1", "prompt text")
    assert key != cache_key("judge-a", "rubric-1", "expected:0:1", "prompt text")
    assert key != cache_key("judge-a", "rubric-1", "number:0:1", "prompt text.")
    cache = JudgeCache(path)
    assert cache.get_many([key]) == {}
    cache.put_many("0", {key: CachedScore(0.4, "0.4"), "other": CachedScore(None, "no score")})
    cache.close()
    reopened = JudgeCache(path)
    found = reopened.get_many([key, "other", "missing"])
    assert found == {key: CachedScore(0.4, "0.4"), "other": CachedScore(None, "no score")}
    assert len(reopened) == 2
    reopened.close()


def test_cache_unwritable_path_is_a_user_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserError, match="judge cache"):
        JudgeCache(blocker / "judge.sqlite")
