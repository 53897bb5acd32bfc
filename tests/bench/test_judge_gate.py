"""bench/judge_gate.py's helpers: format demonstrations from the model's own samples, and one
audit config per judge setting that grpokit loads."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from grpokit.recipes import recipe_dir
from grpokit.rewards.builtin.format import xml_format_score

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "judge_gate.py"


def _run(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_demos_wrap_whole_sentences_in_the_tags(tmp_path: Path) -> None:
    samples = tmp_path / "samples.jsonl"
    rows = [
        # cut by the token limit: the unfinished sentence goes; < and & would break the XML
        {"prompt": "p1", "text": "A <b>shop</b> for cats & dogs. It sells food. Prices are lo"},
        {"prompt": "p2", "text": "Too short."},  # one sentence: dropped
        {"prompt": "p3", "text": "First idea. Second idea! Third idea? Fourth idea."},
        {"prompt": "p3", "text": "First idea. Second idea! Third idea? Fourth idea."},  # twice
    ]
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "demos.jsonl"
    _run("demos", "--samples", str(samples), "--out", str(out), "--min-demos", "1")
    demos = [json.loads(line) for line in out.read_text().splitlines()]
    assert [d["prompt"] for d in demos] == ["p1", "p3"]
    assert demos[0]["completion"] == (
        "<thinking>\nA (b)shop(/b) for cats and dogs.\n</thinking>\n"
        "<proposal>\nIt sells food.\n</proposal>"
    )
    assert "<thinking>\nFirst idea. Second idea!\n</thinking>" in demos[1]["completion"]
    for demo in demos:
        assert xml_format_score(demo["completion"], ["thinking", "proposal"]) == 1.0


def test_too_few_demos_is_an_error(tmp_path: Path) -> None:
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"prompt": "p", "text": "One. Two."}) + "\n")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "demos", "--samples", str(samples), "--out",
         str(tmp_path / "d.jsonl")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1 and "only 1 usable samples" in proc.stderr


def test_audit_configs_load(tmp_path: Path) -> None:
    from grpokit.config import load_config
    from grpokit.rewards.audit.common import pick_reward
    from grpokit.rewards.judge import JudgeParams

    def judge_params(path: Path) -> JudgeParams:
        params = pick_reward(load_config(path).rewards, "judge", None, source=str(path)).params
        assert isinstance(params, JudgeParams)
        return params

    recipe = tmp_path / "recipe"
    shutil.copytree(recipe_dir("business-ideas"), recipe)
    _run("audit-configs", str(recipe / "config.openai.en.yaml"), str(tmp_path / "audit"))
    configs = sorted((tmp_path / "audit").glob("*.yaml"))
    entries = {path.stem: judge_params(path) for path in configs}
    assert list(entries) == [
        "1-seed-rubric-number-t0", "2-number-t0", "3-number-t0.7", "4-expected-t0",
        "5-ensemble3-number-t0.7",
    ]  # fmt: skip
    seed = entries["1-seed-rubric-number-t0"].judges[0]
    assert seed.rubric_file is not None and seed.rubric_file.endswith("rubric_en.txt")
    assert seed.score_range == (0, 1)
    assert entries["4-expected-t0"].mode == "expected"
    ensemble = entries["5-ensemble3-number-t0.7"]
    assert [j.name for j in ensemble.judges] == ["sample0", "sample1", "sample2"]
    assert all(j.temperature == 0.7 for j in ensemble.judges)
    assert entries["2-number-t0"].judges[0].temperature == 0.0


def _write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _step(step: int, fmt: float, judge: float, gated_out: float) -> dict[str, object]:
    """One metrics.jsonl line with the keys the trainer writes for this recipe."""
    return {
        "step": step, "reward": fmt + judge, "rewards/xml_format/mean": fmt,
        "pass_rate/xml_format": fmt, "judge/0/mean": judge,
        "rewards/quality/gated_out_frac": gated_out, "step_time": 10.0 + step,
    }  # fmt: skip


def test_summary_tables_and_figure(tmp_path: Path) -> None:
    # gated: format 0 -> 1 over 4 steps, judge 0.2 -> 0.4; summed: flat
    _write_jsonl(
        tmp_path / "gated-s0" / "metrics.jsonl",
        [_step(i, i / 3, 0.2 + i / 15, 1 - i / 3) for i in range(4)],
    )
    _write_jsonl(
        tmp_path / "summed-s0" / "metrics.jsonl", [_step(i, 0.5, 0.3, 0.0) for i in range(4)]
    )
    samples = [
        {"model": "sft", "rewards": {"xml_format": 0.0, "quality": 0.1}},
        {"model": "sft", "rewards": {"xml_format": 1.0, "quality": 0.3}},
        {"model": "gated-s0", "rewards": {"xml_format": 1.0, "quality": 0.4}},
        {"model": "gated-s0", "rewards": {"xml_format": 1.0, "quality": None}},  # judge failed
        {"model": "summed-s0", "rewards": {"xml_format": 0.7, "quality": 0.5}},
    ]
    _write_jsonl(tmp_path / "eval" / "completions.jsonl", samples)
    report = {
        "judges": [{"spread": 0.01, "parse_failure_rate": 0.25}],
        "ensemble_mean": 0.3, "reward_noise": 0.05, "separation": 0.75,
        "planted": [{"mean": 0.1}, {"mean": 0.2}],
    }  # fmt: skip
    (tmp_path / "audit").mkdir()
    (tmp_path / "audit" / "2-number-t0.json").write_text(json.dumps(report))
    out = _run("summary", str(tmp_path))
    text = (tmp_path / "summary.md").read_text()
    assert text in out
    # the first and last quarter of 4 steps are one step each; median step time 11.5 s
    assert "| gated-s0 | 4 | 0.00 -> 1.00 | 0.200 -> 0.400 | 1.00 | 11.5 (10.0-13.0) |" in text
    assert "| summed-s0 | 4 | 0.50 -> 0.50 | 0.300 -> 0.300 | 1.00 |" in text
    assert "| sft | 2 | 0.50 | 0.200 | 0.300 |" in text
    assert "| gated-s0 | 2 | 1.00 | 0.400 | 0.400 |" in text
    assert "| summed-s0 | 1 | 0.00 | 0.500 | - |" in text
    assert "- gated, 1 seeds: format pass 1.000 (sd -); judge mean (all) 0.400 (sd -)" in text
    assert "| 2-number-t0 | 0.300 | 0.050 | 0.010 | 0.150 | 0.75 | 0.25 |" in text
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_checklist_configs_load(tmp_path: Path) -> None:
    from grpokit.config import load_config
    from grpokit.rewards.builtin.checklist import ChecklistParams

    recipe = tmp_path / "recipe"
    shutil.copytree(recipe_dir("business-ideas"), recipe)
    (recipe / "eval.en.yaml").write_text(
        (recipe / "config.openai.en.yaml").read_text().replace("min: 1.0}", "min: 0.0}")
    )
    _run("checklist-configs", str(recipe), "http://127.0.0.1:9/v1")
    train = load_config(recipe / "config.checklist.server.en.yaml")
    assert [r.type for r in train.rewards] == ["xml_format", "checklist"]
    params = train.rewards[1].params
    assert isinstance(params, ChecklistParams)
    # the audit's at-chance `customer` question is replaced by the target_named program
    assert [i.name for i in params.items] == [
        "revenue_model", "target_named", "product", "kpi", "advantage"
    ]  # fmt: skip
    assert params.items[1].function == "checks.py:target_named"
    assert train.rewards[1].gate is not None and train.rewards[1].gate.min == 1.0
    assert params.judges[0].base_url == "http://127.0.0.1:9/v1"
    scored = load_config(recipe / "eval.checklist.en.yaml")
    assert [r.type for r in scored.rewards] == ["xml_format", "judge", "checklist"]
    items = scored.rewards[2].params
    assert isinstance(items, ChecklistParams) and scored.rewards[2].gate is None
    assert [i.name for i in items.items] == [
        "revenue_model", "customer", "product", "kpi", "advantage", "price_stated",
        "target_named", "kpi_number",
    ]  # fmt: skip


def test_summary_paired_table(tmp_path: Path) -> None:
    # two prompts x two samples; the trained model gains a price on prompt 0 only
    def row(model: str, prompt: int, fmt: float, price: float, kpi: float | None) -> object:
        parts = {"checklist/price_stated": price, "checklist/kpi_number": kpi}
        return {"model": model, "prompt_index": prompt, "parts": parts,
                "rewards": {"xml_format": fmt, "quality": 0.2}}  # fmt: skip

    samples = [
        row("sft", 0, 1.0, 0.0, 0.0), row("sft", 0, 0.7, 0.0, None),
        row("sft", 1, 1.0, 1.0, 1.0), row("sft", 1, 1.0, 0.0, 1.0),
        row("checklist-s0", 0, 1.0, 1.0, 0.0), row("checklist-s0", 0, 1.0, 1.0, 0.0),
        row("checklist-s0", 1, 1.0, 0.0, 1.0), row("checklist-s0", 1, 0.0, 1.0, 1.0),
    ]  # fmt: skip
    _write_jsonl(tmp_path / "eval" / "completions.jsonl", samples)
    # a checklist run logs no judge/0/mean: its mean over the gated-in half, 0.2 / 0.5
    step = _step(1, 0.5, 0.0, 0.5)
    del step["judge/0/mean"]
    _write_jsonl(
        tmp_path / "checklist-s0" / "metrics.jsonl", [{**step, "rewards/quality/mean": 0.2}]
    )
    text = _run("summary", str(tmp_path))
    assert "| checklist-s0 | 1 | 0.50 -> 0.50 | 0.400 -> 0.400 | 0.50 |" in text
    assert "| measure | sft | checklist-s0 (minus sft, 95% CI) |" in text
    # format: sft 0.75 (prompt means 0.5, 1.0), trained 0.75 (1.0, 0.5): differences +0.5, -0.5;
    # t(1 df) 12.706 x sd 0.707 / sqrt 2 = 6.35
    assert "| format pass | 0.75 | 0.75 (+0.00 [-6.35, +6.35]) |" in text
    # price: sft prompt means 0, 0.5; trained 1, 0.5: differences +1, 0 -> +0.5 +- 6.35
    assert (
        "| price_stated (program, trained by neither) | 0.25 | 0.75 (+0.50 [-5.85, +6.85]) |"
        in text
    )
    # kpi: sft's None sample is left out (sft 2 of 3; prompt 0 mean 0 from one sample)
    assert (
        "| kpi_number (program, trained by neither) | 0.67 | 0.50 (+0.00 [+0.00, +0.00]) |" in text
    )


def test_pooled_rows_pair_a_design_over_its_seeds() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from judge_gate import paired_table, pooled_rows
    finally:
        sys.path.remove(str(SCRIPT.parent))

    def row(model: str, prompt: int, fmt: float) -> dict[str, object]:
        return {"model": model, "prompt_index": prompt, "rewards": {"xml_format": fmt}}

    rows = [row("sft", 0, 0.0), row("sft", 1, 0.0),
            row("gated-s0", 0, 1.0), row("gated-s0", 1, 0.0),
            row("gated-s1", 0, 1.0), row("gated-s1", 1, 1.0),
            row("checklist-s0", 0, 1.0), row("checklist-s0", 1, 1.0)]  # fmt: skip
    pooled = pooled_rows(rows)
    # one seed of checklist: no pooled rows; gated's two seeds: their four rows again
    assert [r["model"] for r in pooled[len(rows) :]] == ["gated, seeds 0+1"] * 4
    text = paired_table([r for r in pooled if r["model"] in ("sft", "gated, seeds 0+1")])
    # prompt means 1.0 and 0.5 against 0 and 0: +0.75, t(1 df) 12.706 x 0.354 / sqrt 2 = 3.18
    assert "| format pass | 0.00 | 0.75 (+0.75 [-2.43, +3.93]) |" in text
