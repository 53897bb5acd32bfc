from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from grpokit.core.stats import cluster_pass_interval, t_quantile_975, wilson_interval
from grpokit.errors import UserError
from grpokit.evaluate.cli import eval_cmd
from grpokit.evaluate.eval import (
    Sample,
    eval_alerts,
    render_markdown,
    resolve_model,
    run_eval,
    summarize_eval,
)
from grpokit.evaluate.report import build_report
from grpokit.evaluate.schema import EvalResult
from grpokit.monitor import MonitorConfig


def _samples(model: str, fmt: list[list[float | None]], length: int, text: str) -> list[Sample]:
    out = []
    for i, values in enumerate(fmt):
        for j, v in enumerate(values):
            out.append(
                Sample(
                    model,
                    i,
                    j,
                    f"{text} {i} {j}",
                    v,
                    {"fmt": v, "score": 2.0 * i + j},
                    length,
                    j == 0,
                )  # fmt: skip
            )
    return out


def _hand_result(monitors: MonitorConfig | None = None) -> EvalResult:
    samples = _samples("base", [[1, 0, 0, 0], [0, 0, 0, 0]], 10, "plain") + _samples(
        "trained", [[1, 1, 1, 0], [1, 1, 0, None]], 30, "long"
    )
    return summarize_eval(
        samples,
        labels=["base", "trained"],
        paths={"base": "smollm2", "trained": "runs/x/checkpoint-30"},
        prompts=["prompt A", "prompt B"],
        samples_per_prompt=4,
        reward_names=["fmt", "score"],
        thresholds={"fmt": 1.0},
        seed=0,
        sampling={"temperature": 1.0},
        heldout="heldout.jsonl",
        monitors=monitors,
    )


def test_summarize_eval_hand_checked_table() -> None:
    result = _hand_result()
    base, trained = result.models
    assert (base.compliant, trained.compliant) == (1, 5)  # a None is not a pass
    # Per-prompt cluster interval: prompts A 1/4 and B 0/4 around p = 1/8 give residuals 0.5
    # and -0.5, so the clustered variance 2 * 0.5 / 64 equals the binomial 1/8 * 7/8 / 7:
    # design effect 1, Wilson on 8 samples with t on 2 - 1 df (two prompts say little).
    assert base.compliant_ci == pytest.approx(wilson_interval(1, 8, z=t_quantile_975(1)))
    assert result.intervals == "prompt-cluster"
    fmt_b, fmt_t = base.rewards["fmt"], trained.rewards["fmt"]
    assert (fmt_t.n, fmt_t.none_count, fmt_t.passed) == (7, 1, 5)
    assert fmt_t.pass_rate == pytest.approx(5 / 7)
    # pass@k of base: prompt A has 1 of 4 (pass@1 .25, @2 .5, @4 1), prompt B none
    assert fmt_b.pass_at_k == pytest.approx({1: 0.125, 2: 0.25, 4: 0.5})
    assert base.rewards["score"].threshold is None and base.rewards["score"].pass_rate is None
    assert base.rewards["score"].mean == pytest.approx(2.5)
    assert (base.mean_length, trained.mean_length) == (10, 30)
    assert base.truncated_frac == pytest.approx(0.25)
    assert [p.compliant for p in result.prompts] == [
        {"base": 1, "trained": 3},
        {"base": 0, "trained": 2},
    ]
    paired = {c.metric: c for c in result.paired}
    # per-prompt fmt means: base 0.25, 0; trained 0.75, 2/3 -> differences 0.5, 0.667
    assert paired["fmt"].diff == pytest.approx(7 / 12)
    half = t_quantile_975(1) * (1 / 6 / 2**0.5) / 2**0.5  # 12.706
    assert paired["fmt"].ci == pytest.approx((7 / 12 - half, 7 / 12 + half))
    assert paired["compliant"].diff == pytest.approx(0.5)
    assert paired["compliant"].ci == pytest.approx((0.5, 0.5))
    assert paired["score"].diff == pytest.approx(0.0, abs=1e-12)
    md = render_markdown(result)
    assert "| 0 | prompt A | 4 | 1/4 | 3/4 |" in md
    assert "| 1 | prompt B | 4 | 0/4 | 2/4 |" in md
    assert "| fmt | trained - base | +0.583 |" in md
    assert "fmt >= 1" in md
    assert "95% intervals: per-prompt cluster" in md


def test_eval_alerts_compare_with_the_base() -> None:
    result = _hand_result(MonitorConfig())
    # 3x longer with a higher fmt mean: the length rule fires; the texts are not repetitive
    assert [(a["rule"], a["model"]) for a in result.alerts] == [("length_reward", "trained")]
    base, trained = result.models
    looping = trained.model_copy(
        update={"text": {**trained.text, "completions/repeated_ngram_frac": 0.6}}
    )
    rules = [a["rule"] for a in eval_alerts(MonitorConfig(), base, looping)]
    assert rules == ["repetition", "length_reward"]
    off = MonitorConfig.model_validate({"length_reward": {"enabled": False}})
    assert eval_alerts(off, base, trained) == []


def test_resolve_model_arguments(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for step in (10, 30):
        model = run / f"checkpoint-{step}" / "model"
        model.mkdir(parents=True)
        (model / "adapter_config.json").write_text("{}")
        # Adapter weights (an empty safetensors file): a checkpoint without them is damaged.
        (model / "adapter_model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")
        (model / "grpokit_policy.json").write_text(json.dumps({"base_model": "/models/base"}))
    (run / "config.yaml").write_text("x: 1\n")
    spec = resolve_model(str(run))
    assert (spec.label, spec.name_or_path, spec.run_dir) == (
        "run/checkpoint-30",
        "/models/base",
        run,
    )
    assert spec.init_from == str(run / "checkpoint-30" / "model")
    spec = resolve_model(f"early={run / 'checkpoint-10'}")
    assert spec.label == "early" and spec.init_from == str(run / "checkpoint-10" / "model")
    assert resolve_model("smollm2-135m-instruct").name_or_path == "smollm2-135m-instruct"
    with pytest.raises(UserError, match="no such directory"):
        resolve_model("./missing/model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="neither a model"):
        resolve_model(str(tmp_path / "empty"))


@pytest.fixture
def eval_setup(tmp_path: Path, tiny_model_dir: Path) -> tuple[Path, Path]:
    prompts = tmp_path / "heldout.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in ["Say hello.", "Count to 3.", "2+2?"])
    )
    config = tmp_path / "config.yaml"
    config.write_text(
        f"model: {{name_or_path: {tiny_model_dir}}}\n"
        "data: {train: heldout.jsonl}\n"
        "rewards:\n"
        "  - {type: regex_match, name: has_e, pattern: 'e'}\n"
        "  - {type: repetition_penalty, ngram_size: 2}\n"
        "training: {max_completion_length: 12, temperature: 1.0, num_generations: 4}\n"
    )
    return prompts, config


def test_eval_end_to_end_on_tiny_models(
    eval_setup: tuple[Path, Path],
    tiny_model_dir: Path,
    tiny_model_factory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    prompts, config = eval_setup
    other = tiny_model_factory(seed=1)
    out = tmp_path / "eval"
    result = run_eval(
        [f"base={tiny_model_dir}", f"again={tiny_model_dir}", f"other={other}"],
        prompts,
        samples=4,
        out_dir=out,
        config=config,
        seed=3,
        batch_size=8,  # 2 prompts per chunk: chunking must not change the pairing
        log=lambda _: None,
    )
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 3 * 4
    by_model: dict[str, list[str]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r["completion"])
        assert r["rewards"]["has_e"] == (1.0 if re.search("e", r["completion"]) else 0.0)
    # same weights, same seeds: the same completions
    assert by_model["base"] == by_model["again"]
    assert by_model["base"] != by_model["other"]
    # the table holds exactly what the completions say
    for p in result.prompts:
        for label in ("base", "other"):
            hits = sum(
                r["rewards"]["has_e"] == 1.0 and r["rewards"]["repetition_penalty"] >= 0
                for r in rows
                if r["model"] == label and r["prompt_index"] == p.index
            )
            assert p.compliant[label] == hits
    again = [c for c in result.paired if c.other == "again"]
    assert {c.metric for c in again} == {"has_e", "repetition_penalty", "compliant"}
    assert all(c.diff == 0 and c.ci == (0.0, 0.0) for c in again)
    assert result.thresholds == {"has_e": 1.0, "repetition_penalty": 0.0}
    saved = EvalResult.model_validate_json((out / "eval.json").read_text())
    assert saved.prompts == result.prompts
    assert "| 0 | Say hello. | 4 |" in (out / "eval.md").read_text()

    # the report shows it next to a run
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.6}\n')
    html = build_report(run, eval_dir=out).read_text()
    assert '<section id="eval">' in html and "Say hello." in html


def test_eval_cli_prints_the_table_and_reports_user_errors(
    eval_setup: tuple[Path, Path], tiny_model_dir: Path, tmp_path: Path
) -> None:
    prompts, config = eval_setup
    runner = CliRunner()
    args = ["--model", str(tiny_model_dir), "--prompts", str(prompts), "--samples", "2",
            "--config", str(config), "--max-prompts", "1", "--out", str(tmp_path / "o")]  # fmt: skip
    res = runner.invoke(
        eval_cmd, [*args, "--pass", "repetition_penalty=-0.5", "--among", "repetition_penalty"]
    )
    assert res.exit_code == 0, res.output
    assert "Per prompt: compliant samples per model" in res.output
    assert "repetition_penalty >= -0.5" in res.output
    res = runner.invoke(eval_cmd, [*args, "--pass", "nope=1"])
    assert isinstance(res.exception, UserError) and "--pass 'nope=1'" in str(res.exception)
    res = runner.invoke(eval_cmd, [*args, "--among", "nope"])
    assert isinstance(res.exception, UserError) and "--among 'nope'" in str(res.exception)
    res = runner.invoke(eval_cmd, args[:6])
    assert isinstance(res.exception, UserError) and "--config" in str(res.exception)


def test_checklist_items_summarised_by_hand() -> None:
    def sample(model: str, prompt: int, k: int, parts: dict[str, float | None]) -> Sample:
        return Sample(model, prompt, k, "t", 1.0, {"quality": 1.0}, 5, False, parts=parts)

    # Item "price": 0/1; item "clear": probabilities of yes; one None (not applicable).
    base = [
        sample("base", 0, 0, {"checklist/price": 1.0, "checklist/clear": 0.2}),
        sample("base", 0, 1, {"checklist/price": 0.0, "checklist/clear": 0.4}),
        sample("base", 1, 0, {"checklist/price": 0.0, "checklist/clear": 0.1}),
        sample("base", 1, 1, {"checklist/price": 0.0, "checklist/clear": None}),
    ]
    trained = [
        sample("trained", 0, 0, {"checklist/price": 1.0, "checklist/clear": 0.6}),
        sample("trained", 0, 1, {"checklist/price": 1.0, "checklist/clear": 0.8}),
        sample("trained", 1, 0, {"checklist/price": 1.0, "checklist/clear": 0.5}),
        sample("trained", 1, 1, {"checklist/price": 0.0, "checklist/clear": 0.3}),
    ]
    result = summarize_eval(
        base + trained,
        labels=["base", "trained"],
        paths={},
        prompts=["A", "B"],
        samples_per_prompt=2,
        reward_names=["quality"],
        thresholds={},
        seed=0,
        sampling={},
        heldout="h.jsonl",
        part_names=["checklist/price", "checklist/clear"],
    )
    b, t = (m.checklist for m in result.models)
    price, clear = "eval/checklist/price/pass_rate", "eval/checklist/clear/pass_rate"
    assert list(b) == [price, clear]
    assert (b[price].pass_rate, b[price].n) == (0.25, 4)
    assert t[price].pass_rate == 0.75
    # 0/1 successes: the cluster Wilson interval of the pass rates.
    assert t[price].ci == pytest.approx(cluster_pass_interval([[True, True], [True, False]]))
    # Probabilities: mean 0.7 / 3 over the 3 applicable samples; t interval on 1 df over the
    # cluster standard error (prompt sums 0.6 and 0.1 against 0.7/3 x their sizes 2 and 1).
    assert b[clear].n == 3 and b[clear].pass_rate == pytest.approx(0.7 / 3)
    m = 0.7 / 3
    stderr = (2 * ((0.6 - 2 * m) ** 2 + (0.1 - m) ** 2) / 3**2) ** 0.5
    low = max(0.0, m - t_quantile_975(1) * stderr)
    assert b[clear].ci == pytest.approx((low, min(1.0, m + t_quantile_975(1) * stderr)))
    assert t[clear].pass_rate == pytest.approx(0.55)
    # Paired per prompt: price base 0.5, 0 -> trained 1, 0.5: +0.5 on both prompts.
    paired = {c.metric: c for c in result.paired}
    assert paired[price].diff == pytest.approx(0.5) and paired[price].ci == pytest.approx(
        (0.5, 0.5)
    )
    # clear: base 0.3, 0.1 -> trained 0.7, 0.4: +0.4 and +0.3.
    assert paired[clear].diff == pytest.approx(0.35)
    md = render_markdown(result)
    assert "Checklist items: pass rate per model" in md
    assert f"| {price} | 25% [" in md
    assert f"| {clear} | trained - base | +0.35 |" in md


def test_eval_reports_checklist_items(
    tmp_path: Path, tiny_model_dir: Path, tiny_model_factory: Callable[..., Path]
) -> None:
    prompts = tmp_path / "heldout.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["Say hi.", "Count."]))
    (tmp_path / "checks.py").write_text(
        "def vowels(prompts, completions, **kwargs):\n"
        "    return [sum(ch in 'aeiou' for ch in c) / max(1, len(c)) for c in completions]\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text(
        f"model: {{name_or_path: {tiny_model_dir}}}\n"
        "data: {train: heldout.jsonl}\n"
        "rewards:\n"
        "  - type: checklist\n"
        "    items:\n"
        "      - {name: has_e, regex: 'e'}\n"
        "      - {name: vowels, function: 'checks.py:vowels'}\n"
        "training: {max_completion_length: 8, temperature: 1.0, num_generations: 2}\n"
    )
    out = tmp_path / "eval"
    result = run_eval(
        [f"base={tiny_model_dir}", f"other={tiny_model_factory(seed=1)}"],
        prompts,
        samples=3,
        out_dir=out,
        config=config,
        log=lambda _: None,
    )
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    saved = EvalResult.model_validate_json((out / "eval.json").read_text())
    for model in saved.models:
        mine = [r for r in rows if r["model"] == model.label]
        for item in ("has_e", "vowels"):
            summary = model.checklist[f"eval/checklist/{item}/pass_rate"]
            values = [r["parts"][f"checklist/{item}"] for r in mine]
            assert summary.n == 6
            assert summary.pass_rate == pytest.approx(sum(values) / 6)
        has_e = [r["parts"]["checklist/has_e"] for r in mine]
        assert has_e == [1.0 if "e" in r["completion"] else 0.0 for r in mine]
    metrics = {c.metric for c in result.paired}
    assert {"eval/checklist/has_e/pass_rate", "eval/checklist/vowels/pass_rate"} <= metrics
    assert "Checklist items: pass rate per model" in (out / "eval.md").read_text()


def test_a_gain_that_is_only_length_vanishes_at_equal_length() -> None:
    # A "judge" that scores length alone (0.002 a token) and a trained model that writes about
    # 60 tokens more: the raw paired difference is about +0.12, the difference at equal length
    # 0 (exactly: the score is linear in length), and the table says both.
    samples = [
        Sample(model, p, k, "t", None, {"judged": 0.002 * length}, length, False)
        for p in range(5)
        for k in range(3)
        for model, length in (("base", 100 + 10 * k + p), ("trained", 150 + 20 * k + 3 * p))
    ]
    result = summarize_eval(
        samples,
        labels=["base", "trained"],
        paths={},
        prompts=["a", "b", "c", "d", "e"],
        samples_per_prompt=3,
        reward_names=["judged"],
        thresholds={},
        seed=0,
        sampling={},
        heldout="h.jsonl",
    )
    (c,) = result.paired
    assert c.diff > 0.1 and c.ci is not None and c.ci[0] > 0.0
    assert c.at_equal_length == pytest.approx((0.0, 0.0, 0.0), abs=1e-9)
    assert "at equal length" in render_markdown(result)
    # Written before the field existed: still read.
    old = json.loads(result.model_dump_json())
    del old["paired"][0]["at_equal_length"]
    assert EvalResult.model_validate(old).paired[0].at_equal_length is None


def test_a_comparison_over_the_samples_that_pass_a_reward() -> None:
    # --among fmt: base passes fmt once (prompt A, sample 0, score 0); trained passes it at
    # prompt A samples 0-2 (scores 0, 1, 2: mean 1) and prompt B samples 0-1. Prompt B has no
    # passing base sample, so only prompt A pairs: score 1 - 0 = +1, no interval from one prompt.
    samples = _samples("base", [[1, 0, 0, 0], [0, 0, 0, 0]], 10, "plain") + _samples(
        "trained", [[1, 1, 1, 0], [1, 1, 0, None]], 30, "long"
    )
    kwargs: dict[str, Any] = dict(
        labels=["base", "trained"], paths={}, prompts=["A", "B"], samples_per_prompt=4,
        reward_names=["fmt", "score"], thresholds={"fmt": 1.0}, seed=0, sampling={},
        heldout="h.jsonl",
    )  # fmt: skip
    result = summarize_eval(samples, among=["fmt"], **kwargs)
    (score,) = [c for c in result.paired if c.among == "fmt"]
    assert (score.metric, score.diff, score.ci, score.n_prompts) == ("score", 1.0, None, 1)
    # Over every sample: prompt A 1.5 - 1.5, prompt B 3.5 - 3.5 (trained's mean over its 4).
    overall = [c for c in result.paired if c.among is None and c.metric == "score"]
    assert overall[0].diff == 0.0
    assert "score, where fmt passes" in render_markdown(result)
    with pytest.raises(ValueError, match="no pass threshold"):
        summarize_eval(samples, among=["score"], **kwargs)
