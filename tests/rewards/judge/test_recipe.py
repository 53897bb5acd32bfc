"""The business-ideas recipe end to end: configs load, and (slow) a few GRPO steps on the
embedded model with the in-process judge, gated by the format reward as in the seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpokit.config import load_config
from grpokit.recipes import recipe_dir
from grpokit.rewards.judge.cache import JudgeCache

RECIPE = recipe_dir("business-ideas")


def _rows(name: str) -> list[str]:
    lines = (RECIPE / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["prompt"] for line in lines if line.strip()]


def test_recipe_files() -> None:
    train_ja, heldout_ja = _rows("train_ja.jsonl"), _rows("heldout_ja.jsonl")
    train_en, heldout_en = _rows("train_en.jsonl"), _rows("heldout_en.jsonl")
    assert len(train_ja) == len(train_en) == 16
    assert (len(heldout_ja), len(heldout_en)) == (10, 20)
    assert len(set(train_ja)) == 16 and len(set(heldout_en)) == 20 and len(set(heldout_ja)) == 10
    # held-out topics are never trained on
    assert not set(train_ja) & set(heldout_ja) and not set(train_en) & set(heldout_en)
    assert train_ja[0] == "ターゲット：都心に住む多忙な独身会社員。 技術：IoTとサブスクリプション。"
    assert all(p.startswith("ターゲット：") and "技術：" in p for p in train_ja + heldout_ja)
    assert all(p.startswith("Target: ") and "Technology: " in p for p in train_en + heldout_en)
    for lang in ("ja", "en"):
        system = (RECIPE / f"system_prompt_{lang}.txt").read_text(encoding="utf-8")
        assert "<thinking>" in system and "<proposal>" in system
        rubric = (RECIPE / f"rubric_{lang}.txt").read_text(encoding="utf-8")
        assert rubric.count("{completion}") == 1
        assert rubric.count("0.2") >= 5


@pytest.mark.parametrize(
    ("local_name", "remote_name", "lang"),
    [
        ("config.yaml", "config.openai.yaml", "ja"),
        ("config.en.yaml", "config.openai.en.yaml", "en"),
    ],
)
def test_configs_differ_only_in_the_judges_block(
    local_name: str, remote_name: str, lang: str
) -> None:
    local = load_config(RECIPE / local_name)
    remote = load_config(RECIPE / remote_name)
    assert [r.display_name for r in local.rewards] == ["xml_format", "quality"]
    local_judge, remote_judge = local.rewards[1].params, remote.rewards[1].params
    assert local_judge.judges[0].backend == "local"  # type: ignore[attr-defined]
    assert remote_judge.judges[0].backend == "openai"  # type: ignore[attr-defined]
    assert local_judge.model_dump(exclude={"judges"}) == remote_judge.model_dump(exclude={"judges"})
    assert local.model_dump(exclude={"rewards"}) == remote.model_dump(exclude={"rewards"})
    assert local.rewards[1].gate == remote.rewards[1].gate
    assert local_judge.rubric_file == f"rubric_{lang}.txt"  # type: ignore[attr-defined]
    # The server's judge counts the seed's five criteria as one digit (see the config).
    judge = remote_judge.judges[0]  # type: ignore[attr-defined]
    assert judge.rubric_file == f"rubric_digit_{lang}.txt" and judge.score_range == (0, 5)
    assert judge.max_tokens == 1
    assert local.training.num_generations == 4 and local.training.beta == 0.01


def test_digit_rubrics_keep_the_seeds_criteria() -> None:
    from grpokit.rewards.audit.planted import rubric_keywords
    from grpokit.rewards.judge.rubric import load_rubric

    for lang in ("en", "ja"):
        seed = load_rubric(None, f"rubric_{lang}.txt", RECIPE, "rubric_file")
        digit = load_rubric(None, f"rubric_digit_{lang}.txt", RECIPE, "rubric_file")
        assert len(rubric_keywords(seed)) == 5
        assert rubric_keywords(digit) == rubric_keywords(seed)
        # The question comes after the proposal: the 135M judge answers what it read last.
        assert digit.template.index("{completion}") < digit.template.index("0")


def test_audit_answers_pass_the_gate_on_heldout_topics() -> None:
    from grpokit.rewards.builtin.format import xml_format_score

    rows = [json.loads(line) for line in (RECIPE / "audit_en.jsonl").read_text().splitlines()]
    heldout = _rows("heldout_en.jsonl")
    assert len(rows) == 10 and {r["prompt"] for r in rows} == set(heldout[:5])
    assert all(xml_format_score(r["completion"], ["thinking", "proposal"]) == 1.0 for r in rows)


def _train(tmp_path: Path, extra: list[str]) -> tuple[list[dict[str, float]], Path]:
    from grpokit.train.run import train_from_config

    overrides = [
        "training.max_steps=2",
        "training.per_device_train_batch_size=4",
        "training.gradient_accumulation_steps=1",
        "training.max_completion_length=32",
        "training.report_to=[none]",
        "training.num_completions_to_print=0",
        *extra,
    ]
    run_dir = tmp_path / "run"
    result = train_from_config(
        RECIPE / "config.yaml", overrides, output_dir=run_dir, progress=False
    )
    assert result.global_step == 2
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()], run_dir


@pytest.mark.slow
def test_recipe_trains_with_the_gate(tmp_path: Path) -> None:
    metrics, _ = _train(tmp_path, [])
    steps = [m for m in metrics if "rewards/quality/gated_out_frac" in m]
    assert len(steps) == 2
    for m in steps:
        # The gate's share is visible; a base 135M model rarely formats perfectly.
        assert 0.0 <= m["rewards/quality/gated_out_frac"] <= 1.0
        assert "rewards/xml_format/mean" in m


@pytest.mark.slow
def test_recipe_judge_scores_when_the_gate_is_open(tmp_path: Path) -> None:
    # The same run with the gate opened for everything, so the local judge sees every
    # completion during training (with the seed's gate it may see none in two steps).
    metrics, run_dir = _train(tmp_path, ["rewards.1.gate.min=0.0"])
    steps = [m for m in metrics if "rewards/quality/gated_out_frac" in m]
    assert len(steps) == 2
    assert all(m["rewards/quality/gated_out_frac"] == 0.0 for m in steps)
    # Whether the 135M judge wrote a number or not (with the seed's rubric it mostly echoes the
    # rubric), each completion got a score or a counted None, never a crash.
    assert all(0.0 <= m["rewards/quality/none_frac"] <= 1.0 for m in steps)
    cache = JudgeCache(run_dir / "judge_cache.sqlite")
    try:
        assert len(cache) > 0  # the judge ran, and its scores were kept
    finally:
        cache.close()


@pytest.mark.slow
def test_the_real_model_recipe_trains_two_steps(tmp_path: Path) -> None:
    """config.qwen.checklist.en.yaml as shipped, two steps: the 0.5B policy, the 1.5B judge that
    grpokit serves itself, asked completion by completion; the server goes with the run."""
    import tempfile

    from grpokit.hub.named import NAMED_MODELS, is_installed
    from grpokit.train.run import train_from_config

    for name in ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"):
        if not is_installed(NAMED_MODELS[name]):
            pytest.skip(f"{name} is not installed: make setup-models")
    logs = set(Path(tempfile.gettempdir()).glob("grpokit-judge-server-*.log"))
    overrides = [
        "training.max_steps=2",
        "training.save_steps=0",
        "training.max_completion_length=200",
        "training.report_to=[none]",
        "training.num_completions_to_print=0",
    ]
    run_dir = tmp_path / "run"
    result = train_from_config(
        RECIPE / "config.qwen.checklist.en.yaml", overrides, output_dir=run_dir, progress=False
    )
    assert result.global_step == 2
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    steps = [m for m in (json.loads(line) for line in lines) if "pass_rate/xml_format" in m]
    assert len(steps) == 2
    judged = [m for m in steps if m["pass_rate/xml_format"] > 0]
    for m in judged:  # every formatted sample's four questions were answered, from the server
        for item in ("revenue_model", "customer", "kpi", "advantage"):
            assert m[f"judge/{item}/request_failure_rate"] == 0.0
            assert m[f"judge/{item}/expected_fallback_rate"] == 0.0
        # A completion's later questions found its first one in the server's prompt cache.
        assert m["judge/tokens_cached"] > 0
    # The run stopped its judge server (which removes its log).
    assert set(Path(tempfile.gettempdir()).glob("grpokit-judge-server-*.log")) <= logs
