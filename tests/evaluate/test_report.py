from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from synthetic_run import PROMPT_JA, SCRIPT, make_run

from grpokit.errors import UserError
from grpokit.evaluate.cli import compare_cmd, report_cmd
from grpokit.evaluate.compare import compare_runs, config_differences, run_labels
from grpokit.evaluate.html import esc
from grpokit.evaluate.report import build_report, pick_samples, samples_html
from grpokit.evaluate.rundir import load_run
from grpokit.evaluate.schema import (
    EvalResult,
    ModelSummary,
    PairedComparison,
    PromptResult,
    RewardSummary,
)
from grpokit.rewards.builtin.format import xml_format
from grpokit.rewards.text import completion_text

PLOTS = {"rewards", "dynamics", "completions", "timing", "pass_rates", "heldout"}


def _external_refs(html: str) -> list[str]:
    return [u for u in re.findall(r'(?:src|href)="([^"]*)"', html) if not u.startswith("data:")]


def test_report_has_every_section_and_png(run_dir: Path) -> None:
    out = build_report(run_dir)
    assert out == run_dir / "report" / "report.html"
    html = out.read_text(encoding="utf-8")
    for anchor in ["run", "rewards", "dynamics", "completions", "timing", "forecast", "heldout",
                   "alerts", "samples"]:  # fmt: skip
        assert f'<section id="{anchor}">' in html
    assert {p.stem for p in (run_dir / "report").glob("*.png")} == PLOTS
    for name in PLOTS:
        assert (run_dir / "report" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert html.count('src="data:image/png;base64,') == len(PLOTS)
    assert _external_refs(html) == []
    # config, versions, alerts, preflight
    assert "repetition_penalty, weight: 0.5" in html
    assert "transformers" in html and "4.57.0" in html
    assert "length grew 45%" in html and "repeated n-gram share rose" in html
    assert "2 monitor alert(s)" in html
    assert "measured_pass_rate" in html
    assert "mismatch/kl" in html  # the sampler/trainer gap in the summary
    assert "Skipped" not in html


def test_report_escapes_completions_and_keeps_japanese(run_dir: Path) -> None:
    html = build_report(run_dir).read_text(encoding="utf-8")
    assert "<script" not in html.lower()
    assert "<img src=x" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "&lt;script&gt;document.title=&quot;pwned&quot;&lt;/script&gt;" in html
    assert PROMPT_JA in html
    assert "カロリーの少ない食材の選択" in html


def test_samples_pair_the_same_prompt_early_and_late(run_dir: Path) -> None:
    run = load_run(run_dir)
    picked = pick_samples(run.completions)
    assert picked is not None
    (early_step, early_prompt, early), (late_step, late_prompt, late) = picked
    assert (early_step, late_step) == (1, 26)
    assert early_prompt == late_prompt == PROMPT_JA
    assert len(early) == len(late) == 4
    assert any(r["completion"] == SCRIPT for r in early)


def test_a_report_shows_the_text_the_rewards_scored() -> None:
    # Chat completions as TRL hands them over: content given as parts, and a reply in two
    # messages. The page must show what the rewards read, not the last message or a repr.
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "<thinking>t</thinking>"}]}]
    split = [
        {"role": "assistant", "content": "<thinking>add</thinking>"},
        {"role": "assistant", "content": "<answer>4</answer>"},
    ]
    rows = [
        {"step": step, "prompt": "2+2?", "completion": completion, "reward": 0.5}
        for step in (1, 2)
        for completion in (parts, split)
    ]
    html = samples_html(rows)
    scored = xml_format(tags=["thinking", "answer"])(
        prompts=["2+2?", "2+2?"], completions=[parts, split]
    )
    assert scored == [0.0, 1.0]  # the reward read both messages of the split reply
    for completion in (parts, split):
        assert f"<pre>{esc(completion_text(completion))}</pre>" in html
    assert "&#x27;type&#x27;" not in html and "'type'" not in html


def test_truncated_metrics_still_report_and_say_so(run_dir: Path) -> None:
    with (run_dir / "metrics.jsonl").open("a", encoding="utf-8") as f:
        f.write('{"step": 31, "reward": 5.1, "kl": 0.0')  # killed mid-write, no newline
    html = build_report(run_dir).read_text(encoding="utf-8")
    assert "Skipped 1 unreadable line(s)" in html
    assert "metrics.jsonl line 31: truncated" in html
    assert "30 (1 - 30)" in html


def test_corrupt_middle_line_and_duplicate_step(run_dir: Path) -> None:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[4] = lines[4][:20] + "@@" + lines[4][20:]
    lines.append(lines[-1])  # step 30 twice, as after a resume
    lines.append('"just a string"')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = load_run(run_dir)
    assert [(s.line, s.reason.split(":")[0]) for s in run.skipped] == [
        (5, "not valid JSON"),
        (32, "not a JSON object"),
    ]
    assert len(run.metrics) == 29 and run.steps[-1] == 30
    html = build_report(run_dir).read_text(encoding="utf-8")
    assert "Skipped 2 unreadable line(s)" in html
    assert "step 30 is logged more than once" in html


def test_report_errors_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        build_report(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="metrics.jsonl does not exist"):
        build_report(tmp_path / "empty")
    (tmp_path / "empty" / "metrics.jsonl").write_text('{"step": 1, "rew')
    with pytest.raises(UserError, match=r"no metrics rows \(1 unreadable lines\)"):
        build_report(tmp_path / "empty")


def test_minimal_run_without_optional_files(tmp_path: Path) -> None:
    run = tmp_path / "bare"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward": 0.1 * s, "loss": 0.0}) + "\n" for s in range(1, 4))
    )
    html = build_report(run, out=tmp_path / "r.html").read_text(encoding="utf-8")
    assert "no config.yaml" in html and "no versions.json" in html
    assert "No monitor fired." in html
    assert "beta = 0: no reference model" not in html  # drawn into the PNG, not the page
    assert {p.stem for p in (run / "report").glob("*.png")} == {
        "rewards",
        "dynamics",
        "completions",
    }


def _eval_result() -> EvalResult:
    def summary(label: str, passed: int) -> ModelSummary:
        return ModelSummary(
            label=label,
            path=f"/models/{label}",
            samples=8,
            compliant=passed,
            compliant_rate=passed / 8,
            compliant_ci=(0.1, 0.6),
            mean_length=42.0,
            truncated_frac=0.25,
            rewards={
                "xml_format": RewardSummary(
                    mean=passed / 8,
                    std=0.5,
                    n=8,
                    none_count=0,
                    threshold=1.0,
                    passed=passed,
                    pass_rate=passed / 8,
                    pass_ci=(0.1, 0.6),
                    pass_at_k={1: passed / 8, 2: 0.5},
                )  # fmt: skip
            },
        )

    return EvalResult(
        created="2026-01-01T00:00:00Z",
        heldout="heldout_ja.jsonl",
        samples_per_prompt=4,
        seed=0,
        sampling={"temperature": 1.0},
        rewards=["xml_format"],
        models=[summary("base", 1), summary("trained", 5)],
        prompts=[
            PromptResult(index=0, prompt=PROMPT_JA, samples=4, compliant={"base": 0, "trained": 3}),
            PromptResult(
                index=1, prompt="<b>bold</b>", samples=4, compliant={"base": 1, "trained": 2}
            ),
        ],
        paired=[
            PairedComparison(
                metric="xml_format",
                base="base",
                other="trained",
                diff=0.5,
                ci=(0.1, 0.9),
                n_prompts=2,
            )  # fmt: skip
        ],
    )


def test_report_with_eval_table(run_dir: Path, tmp_path: Path) -> None:
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    (eval_dir / "eval.json").write_text(_eval_result().model_dump_json(), encoding="utf-8")
    html = build_report(run_dir, eval_dir=eval_dir).read_text(encoding="utf-8")
    assert '<section id="eval">' in html
    assert "<td>0/4</td><td>3/4</td>" in html
    assert "&lt;b&gt;bold&lt;/b&gt;" in html
    assert "12% [10, 60]" in html and "[+0.1, +0.9]" in html
    # An eval.json written before the cluster intervals says its intervals are Wilson's.
    assert "95% intervals: Wilson over all samples as if independent" in html
    clustered = _eval_result().model_copy(update={"intervals": "prompt-cluster"})
    (eval_dir / "eval.json").write_text(clustered.model_dump_json(), encoding="utf-8")
    html = build_report(run_dir, eval_dir=eval_dir).read_text(encoding="utf-8")
    assert "95% intervals: per-prompt cluster (Wilson on the effective sample size" in html
    assert "as if independent" not in html
    (eval_dir / "eval.json").write_text('{"format": "other"}')
    with pytest.raises(UserError, match="not a grpokit eval file"):
        build_report(run_dir, eval_dir=eval_dir)
    with pytest.raises(UserError, match="no eval.json"):
        build_report(run_dir, eval_dir=tmp_path)


def test_report_with_eval_shows_the_eval_s_warnings(tmp_path: Path) -> None:
    """A run whose training fired no monitor, with an eval that warned: the report says so,
    not "No monitor fired." alone."""
    run = tmp_path / "quiet"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward": 0.1 * s, "loss": 0.0}) + "\n" for s in range(1, 4))
    )
    warned = _eval_result().model_copy(
        update={
            "alerts": [
                {
                    "rule": "repetition",
                    "model": "trained",
                    "value": 0.41,
                    "message": "trained: repeated n-gram share 0.41 vs 0.05 for base",
                },
                {
                    "rule": "group_dominance",
                    "model": "trained",
                    "value": 0.75,
                    "message": "trained: one text fills 75% of a prompt's samples",
                },
            ]  # fmt: skip
        }
    )
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    (eval_dir / "eval.json").write_text(warned.model_dump_json(), encoding="utf-8")
    html = build_report(run, eval_dir=eval_dir, out=tmp_path / "r.html").read_text("utf-8")
    alerts = html.split('<section id="alerts">')[1].split("</section>")[0]
    assert "No monitor fired." not in alerts
    assert "No monitor fired during training." in alerts
    assert "2 warning(s) on the eval samples" in alerts
    assert "repeated n-gram share 0.41 vs 0.05 for base" in alerts
    assert esc("one text fills 75% of a prompt's samples") in alerts


def test_compare_overlays_runs_and_lists_config_differences(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a" / "run", beta=0.0, seed=1)
    b = make_run(tmp_path / "b" / "run", beta=0.04, seed=2, steps=20)
    out = compare_runs([a, b], tmp_path / "cmp.html")
    html = out.read_text(encoding="utf-8")
    assert (tmp_path / "cmp_plots" / "key_curves.png").is_file()
    assert (tmp_path / "cmp_plots" / "rewards.png").is_file()
    assert (tmp_path / "cmp_plots" / "heldout.png").is_file()  # the periodic evals, as points
    # Each run's alerts side by side: run, step, rule, evidence.
    assert '<td>a/run</td><td class="num">18</td><td>length_reward</td>' in html
    assert '<td>b/run</td><td class="num">18</td><td>length_reward</td>' in html
    assert html.count("<td>repetition</td>") == 1  # step 24: only run a got that far
    assert "<td>training.beta</td><td>0.0</td><td>0.04</td>" in html
    assert "training.max_steps" in html
    assert _external_refs(html) == []
    assert run_labels([a, b]) == ["a/run", "b/run"]
    assert config_differences([load_run(a), load_run(a)]) == []
    with pytest.raises(UserError, match="at least two"):
        compare_runs([a], tmp_path / "x.html")


def test_cli_commands(run_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(report_cmd, [str(run_dir), "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    assert "report:" in res.output and (tmp_path / "r.html").is_file()
    res = runner.invoke(report_cmd, [str(tmp_path / "missing")])
    assert isinstance(res.exception, UserError)
    res = runner.invoke(
        compare_cmd, [str(run_dir), str(run_dir), "--out", str(tmp_path / "c.html")]
    )
    assert res.exit_code == 0, res.output


def test_judge_usage_sums_the_steps_totals(tmp_path: Path) -> None:
    from grpokit.evaluate.report import judge_usage_rows
    from grpokit.evaluate.rundir import RunData

    def run(metrics: list[dict[str, float]]) -> RunData:
        rows = [{"step": i + 1, **m} for i, m in enumerate(metrics)]
        return RunData(tmp_path, None, {}, {}, rows, [], None)

    # One judge reward: its totals and a per-judge part that must not be counted twice.
    one = run(
        [
            {"judge/tokens_in": 1000, "judge/0/tokens_in": 1000, "judge/tokens_out": 10},
            {"judge/tokens_in": 500, "judge/0/tokens_in": 500, "judge/tokens_out": 5},
        ]
    )
    assert judge_usage_rows(one) == [["judge tokens in", "1,500"], ["judge tokens out", "15"]]
    # Two reporting rewards: each reward's totals, priced.
    two = run(
        [{"judge/a/cost": 0.25, "judge/a/0/cost": 0.25, "judge/b/cost": 0.5}, {"judge/a/cost": 1}]
    )
    assert judge_usage_rows(two) == [["judge cost", "1.75"]]
    assert judge_usage_rows(run([{"reward": 1.0}])) == []


def test_forecast_rows_hold_checklist_items_against_heldout(tmp_path: Path) -> None:
    from grpokit.evaluate.report import forecast_rows
    from grpokit.evaluate.rundir import RunData

    rows = [
        {"step": 1, "pass_rate/quality": 0.2, "forecast/quality/pass_rate": 0.5,
         "checklist/price/pass_rate": 0.25, "forecast/checklist/price/pass_rate": 0.75},
        {"step": 2, "pass_rate/quality": 0.4, "checklist/price/pass_rate": 0.5,
         "eval/quality/pass_rate": 0.3, "eval/checklist/price/pass_rate": 0.6},
    ]  # fmt: skip
    run = RunData(tmp_path, None, {}, {}, rows, [], None)
    assert forecast_rows(run, ["quality"]) == [
        ["quality", "50%", "20%", "40%", "30%"],
        ["checklist/price", "75%", "25%", "50%", "60%"],
    ]
