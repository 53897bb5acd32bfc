"""The seed's system on the embedded model: a format gate in front of a real judge.

Helpers of ``bench/judge_gate.sh`` (which runs everything; see its header):

- ``demos``: format demonstrations made from the base model's own samples, each cut at a
  sentence end and split into a <thinking> half and a <proposal> half. The SFT warm-start then
  teaches the tags and nothing about the content, so any later change in the judge's score is
  GRPO's work, not the demonstrations'.
- ``summary``: per run (gated / summed, several seeds) the format pass rate and the judge's mean
  early and late in training, the held-out results of ``grpokit eval``, the audit table of
  ``grpokit judge audit`` per judge setting, as Markdown; and the curves as PNG figures.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_XML_UNSAFE = str.maketrans({"<": "(", ">": ")", "&": "and"})


# ---- demonstrations ------------------------------------------------------------------------------


def sentences(text: str, max_words: int) -> list[str]:
    """The whole sentences of ``text`` that fit in ``max_words`` words, XML-safe.

    A sample cut by the token limit loses its unfinished last sentence.
    """
    parts = [p.strip() for p in _SENTENCE_END.split(text.translate(_XML_UNSAFE).strip())]
    kept: list[str] = []
    words = 0
    for part in parts:
        if not part or part[-1] not in ".!?":
            break
        words += len(part.split())
        if words > max_words:
            break
        kept.append(" ".join(part.split()))
    return kept


def wrap_in_tags(parts: Sequence[str], tags: tuple[str, str]) -> str:
    """``parts`` split in two halves, the first in ``tags[0]``, the second in ``tags[1]``."""
    half = max(1, len(parts) // 2)
    first, second = " ".join(parts[:half]), " ".join(parts[half:])
    return f"<{tags[0]}>\n{first}\n</{tags[0]}>\n<{tags[1]}>\n{second}\n</{tags[1]}>"


def format_demos(
    rows: Sequence[dict[str, Any]], tags: tuple[str, str], *, max_words: int, min_sentences: int
) -> list[dict[str, str]]:
    """Demonstrations from ``grpokit generate --out`` rows (``prompt``, ``text``)."""
    demos: list[dict[str, str]] = []
    seen: set[str] = set()
    for row in rows:
        parts = sentences(str(row["text"]), max_words)
        if len(parts) < min_sentences:
            continue
        completion = wrap_in_tags(parts, tags)
        if completion not in seen:
            seen.add(completion)
            demos.append({"prompt": str(row["prompt"]), "completion": completion})
    return demos


def _demos_command(args: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in Path(args.samples).read_text().splitlines() if line]
    demos = format_demos(
        rows,
        (args.tags[0], args.tags[1]),
        max_words=args.max_words,
        min_sentences=args.min_sentences,
    )
    if len(demos) < args.min_demos:
        sys.exit(f"only {len(demos)} usable samples in {args.samples}; sample more")
    Path(args.out).write_text("".join(json.dumps(d) + "\n" for d in demos))
    print(f"{len(demos)} demonstrations from {len(rows)} samples -> {args.out}")


# ---- audit settings ------------------------------------------------------------------------------


def audit_settings(judge: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The judge settings the audit compares, as updates of the recipe's judge reward entry.

    ``judge`` is the recipe's one judge (the 0-5 digit rubric behind the server); the seed's own
    rubric is audited too, to show what the small judge makes of it.
    """
    seed_rubric = {
        "rubric_file": "rubric_en.txt", "score_range": [0, 1], "max_tokens": 16
    }  # fmt: skip
    sampled = {**judge, "temperature": 0.7}
    return {
        "1-seed-rubric-number-t0": {"mode": "number", "judges": [{**judge, **seed_rubric}]},
        "2-number-t0": {"mode": "number", "judges": [judge]},
        "3-number-t0.7": {"mode": "number", "judges": [sampled]},
        "4-expected-t0": {"mode": "expected", "judges": [judge]},
        "5-ensemble3-number-t0.7": {
            "mode": "number",
            "aggregate": "mean",
            "judges": [{**sampled, "name": f"sample{i}"} for i in range(3)],
        },
    }


def _audit_configs_command(args: argparse.Namespace) -> None:
    import yaml

    config_path = Path(args.config).resolve()
    config = yaml.safe_load(config_path.read_text())
    entry = next(r for r in config["rewards"] if r.get("type") == "judge")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, update in audit_settings(dict(entry["judges"][0])).items():
        variant = dict(config)
        variant["rewards"] = [
            {**r, **update} if r.get("type") == "judge" else r for r in config["rewards"]
        ]
        variant = json.loads(json.dumps(variant))  # no shared objects: no YAML anchors
        judge_entry = next(r for r in variant["rewards"] if r.get("type") == "judge")
        # Paths relative to the recipe, wherever the variant is written.
        variant["data"] = {
            key: str(config_path.parent / value) if isinstance(value, str) else value
            for key, value in variant["data"].items()
        }
        for judge in [judge_entry, *judge_entry["judges"]]:
            if "rubric_file" in judge:
                judge["rubric_file"] = str(config_path.parent / judge["rubric_file"])
        (out / f"{name}.yaml").write_text(yaml.safe_dump(variant, sort_keys=False))
    print(f"{len(audit_settings({}))} audit configs in {out}")


# ---- the checklist design ----------------------------------------------------------------------

CHANCE_ITEMS = {"customer": "target_named"}
"""Judge items the item audit (recipe README) found at chance, and the program item that
replaces each in the checklist design. ``product`` is near chance too but no program can check
whether a product is clear, so it stays a question."""

INDEPENDENT_PROGRAMS = ("price_stated", "kpi_number")
"""Program items neither design trains on: independent held-out checks of quality."""


def checklist_configs(
    seed_config: dict[str, Any],
    questions: dict[str, Any],
    programs: dict[str, Any],
    eval_config: dict[str, Any],
    server_judge: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checklist design's training config and the eval config that scores both designs.

    ``seed_config``: the recipe's config.openai.en.yaml (its sizes and data are kept);
    ``questions`` / ``programs``: config.checklist.en.yaml / config.checklist.program.en.yaml;
    ``eval_config``: the seed config with its judge ungated; ``server_judge``: the judge entry
    for yes/no questions behind the server. The training checklist is the question checklist
    with each item of :data:`CHANCE_ITEMS` replaced by its program; the eval adds to the seed's
    rewards one ungated checklist ``items`` holding every question and every program item.
    """
    by_name = {i["name"]: i for r in programs["rewards"] if r["type"] == "checklist"
               for i in r["items"]}  # fmt: skip
    asked = next(r for r in questions["rewards"] if r["type"] == "checklist")
    trained_items = [by_name[CHANCE_ITEMS[i["name"]]] if i["name"] in CHANCE_ITEMS else i
                     for i in asked["items"]]  # fmt: skip
    train = json.loads(json.dumps(seed_config))  # a deep copy without YAML anchors
    train["rewards"] = [
        r if r["type"] != "judge" else
        {"type": "checklist", "name": r["name"], "gate": r["gate"], "items": trained_items,
         "judges": [server_judge]}
        for r in seed_config["rewards"]
    ]  # fmt: skip
    scored = json.loads(json.dumps(eval_config))
    every_item = list(asked["items"]) + [by_name[n] for n in by_name if n not in
                                         {i["name"] for i in asked["items"]}]  # fmt: skip
    scored["rewards"].append(
        {"type": "checklist", "name": "items", "items": every_item, "judges": [server_judge]}
    )
    return train, scored


def _checklist_configs_command(args: argparse.Namespace) -> None:
    import yaml

    recipe = Path(args.recipe)

    def load(name: str) -> dict[str, Any]:
        loaded: dict[str, Any] = yaml.safe_load((recipe / name).read_text())
        return loaded

    judge = {"backend": "openai", "base_url": args.url, "model": "smollm2", "max_tokens": 2,
             "max_concurrency": 1}  # fmt: skip
    train, scored = checklist_configs(
        load("config.openai.en.yaml"), load("config.checklist.en.yaml"),
        load("config.checklist.program.en.yaml"), load(args.eval_config), judge,
    )  # fmt: skip
    for name, config in (("config.checklist.server.en.yaml", train),
                         ("eval.checklist.en.yaml", scored)):  # fmt: skip
        (recipe / name).write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    print(f"checklist training and eval configs in {recipe}")


# ---- summary -------------------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and not math.isnan(v)]


def mean_or_nan(values: Sequence[float | None]) -> float:
    present = _finite(values)
    return statistics.fmean(present) if present else math.nan


@dataclass
class RunCurves:
    """The per-step curves of one training run."""

    name: str
    variant: str
    """"gated" or "summed"."""
    seed: int
    format_pass: list[float]
    """Share of the step's completions with a perfect format."""
    judge: list[float]
    """The judge's mean over the completions it scored (NaN where it scored none)."""
    judged: list[float]
    """Share of the step's completions the judge scored (1 - gated-out share)."""
    reward: list[float]
    step_seconds: list[float]


def _number(value: float | None) -> float:
    """A logged metric as a float; NaN where it is missing or null (a step whose gate let no
    answer through to the judge logs a null judge mean)."""
    return math.nan if value is None else float(value)


def _scored_mean(metrics: dict[str, Any]) -> float:
    """A checklist run's reward mean over the completions its gate let through (the items'
    weighted mean; gated-out ones score 0 in ``rewards/quality/mean``)."""
    judged = 1.0 - float(metrics.get("rewards/quality/gated_out_frac", 0.0))
    mean = _number(metrics.get("rewards/quality/mean"))
    return mean / judged if judged > 0 else math.nan


def design_and_seed(name: str) -> tuple[str, str]:
    """A run's name as judge_gate.sh writes it, "DESIGN-sSEED", split: ("gated", "0")."""
    design, _, seed = name.rpartition("-s")
    return design, seed


def run_curves(run_dir: Path) -> RunCurves:
    variant, seed = design_and_seed(run_dir.name)
    steps = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "rewards/xml_format/mean" in m]
    return RunCurves(
        name=run_dir.name,
        variant=variant,
        seed=int(seed),
        format_pass=[float(m.get("pass_rate/xml_format", math.nan)) for m in steps],
        judge=[
            _number(m.get("judge/0/mean")) if "judge/0/mean" in m else _scored_mean(m)
            for m in steps
        ],  # fmt: skip
        judged=[1.0 - float(m.get("rewards/quality/gated_out_frac", 0.0)) for m in steps],
        reward=[float(m["reward"]) for m in steps],
        step_seconds=[float(m.get("step_time", math.nan)) for m in steps],
    )


def early_late(values: Sequence[float], share: float = 0.25) -> tuple[float, float]:
    """Means over the first and the last ``share`` of the steps."""
    k = max(1, round(len(values) * share))
    return mean_or_nan(values[:k]), mean_or_nan(values[-k:])


def _f(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def training_table(runs: Sequence[RunCurves]) -> str:
    lines = [
        "| run | steps | format pass, first -> last quarter | judge mean (scored ones), "
        "first -> last quarter | share judged, last quarter | seconds per step, median "
        "(min-max) |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        f0, f1 = early_late(run.format_pass)
        j0, j1 = early_late(run.judge)
        _, judged = early_late(run.judged)
        seconds = _finite(run.step_seconds)
        timing = (
            f"{statistics.median(seconds):.1f} ({min(seconds):.1f}-{max(seconds):.1f})"
            if seconds
            else "-"
        )
        lines.append(
            f"| {run.name} | {len(run.reward)} | {_f(f0)} -> {_f(f1)} | {_f(j0, 3)} -> "
            f"{_f(j1, 3)} | {_f(judged)} | {timing} |"
        )
    return "\n".join(lines)


@dataclass
class HeldOut:
    """Held-out samples of one model, scored by the judge whatever their format."""

    model: str
    samples: int
    format_pass: float
    judge_all: float
    judge_formatted: float


def heldout_results(completions: Path) -> list[HeldOut]:
    rows = read_jsonl(completions)
    out: list[HeldOut] = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        formatted = [r for r in mine if r["rewards"].get("xml_format") == 1.0]
        out.append(
            HeldOut(
                model=model,
                samples=len(mine),
                format_pass=len(formatted) / len(mine),
                judge_all=mean_or_nan([r["rewards"].get("quality") for r in mine]),
                judge_formatted=mean_or_nan([r["rewards"].get("quality") for r in formatted]),
            )
        )
    return out


def heldout_table(results: Sequence[HeldOut]) -> str:
    lines = [
        "| model | samples | format pass | judge mean, all samples | judge mean, formatted |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.model} | {r.samples} | {_f(r.format_pass)} | {_f(r.judge_all, 3)} | "
            f"{_f(r.judge_formatted, 3)} |"
        )
    return "\n".join(lines)


def variant_means(results: Sequence[HeldOut]) -> str:
    """Held-out means per variant over its seeds, with the seeds' spread."""
    lines = []
    for variant in ("gated", "summed", "checklist"):
        group = [r for r in results if r.model.startswith(variant + "-")]
        if not group:
            continue
        parts = []
        for label, values in (
            ("format pass", [r.format_pass for r in group]),
            ("judge mean (all)", [r.judge_all for r in group]),
        ):
            spread = statistics.stdev(values) if len(values) > 1 else math.nan
            parts.append(f"{label} {_f(statistics.fmean(values), 3)} (sd {_f(spread, 3)})")
        lines.append(f"- {variant}, {len(group)} seeds: " + "; ".join(parts))
    return "\n".join(lines)


def _sample_values(row: dict[str, Any]) -> dict[str, float | None]:
    """One held-out sample's measures: format pass (0/1), the seed judge's score, and each
    checklist item's score (0/1 for programs, P(yes) for questions; None: not applicable)."""
    values: dict[str, float | None] = {
        "format pass": float(row["rewards"].get("xml_format") == 1.0),
        "judge score (seed rubric)": row["rewards"].get("quality"),
    }
    # grpokit eval writes the items under "parts"; runs evaluated before 2026-12-02 under
    # "checklist".
    for part, value in row.get("parts", row.get("checklist", {})).items():
        values[part.removeprefix("checklist/")] = value
    return values


def _measure_label(name: str) -> str:
    if name in INDEPENDENT_PROGRAMS:
        return f"{name} (program, trained by neither)"
    if name in CHANCE_ITEMS.values():
        return f"{name} (program, trained by checklist)"
    return name


def paired_table(rows: Sequence[dict[str, Any]]) -> str:
    """Held-out measures per model against the first model (the start of every run), from
    ``grpokit eval``'s completions.jsonl rows: the rate, and the difference with its paired 95%
    interval over prompts (:func:`grpokit.core.stats.paired_difference`; per-prompt means are
    the units, so a handful of prompts gives wide intervals)."""
    from grpokit.core.stats import paired_difference

    models = list(dict.fromkeys(r["model"] for r in rows))
    prompts = sorted({int(r["prompt_index"]) for r in rows})
    per: dict[tuple[str, str, int], list[float]] = {}
    measures: dict[str, None] = {}
    for row in rows:
        for name, value in _sample_values(row).items():
            measures[name] = None
            if value is not None:
                key = (row["model"], name, int(row["prompt_index"]))
                per.setdefault(key, []).append(float(value))
    base = models[0]
    head = [f"| measure | {base} |", "|---|---|"]
    for model in models[1:]:
        head[0] += f" {model} (minus {base}, 95% CI) |"
        head[1] += "---|"
    lines = head
    for name in measures:
        pooled = [v for (m, n, _), vs in per.items() if m == base and n == name for v in vs]
        cells = [_measure_label(name), _f(mean_or_nan(pooled))]
        base_means = {p: statistics.fmean(per[(base, name, p)]) for p in prompts
                      if (base, name, p) in per}  # fmt: skip
        for model in models[1:]:
            mine = [v for (m, n, _), vs in per.items() if m == model and n == name for v in vs]
            pairs = [(statistics.fmean(per[(model, name, p)]), base_means[p])
                     for p in base_means if (model, name, p) in per]  # fmt: skip
            cell = _f(mean_or_nan(mine))
            if len(pairs) > 1:
                diff, lo, hi = paired_difference([a for a, _ in pairs], [b for _, b in pairs])
                cell += f" ({diff:+.2f} [{lo:+.2f}, {hi:+.2f}])"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pooled_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` and, for each design trained with two seeds or more, its rows again under
    "DESIGN, seeds A+B": the design's per-prompt mean over its seeds, so that
    :func:`paired_table` pairs a design, not one run, with the start (every run has the same
    prompts and samples per prompt)."""
    seeds: dict[str, list[str]] = {}
    for model in dict.fromkeys(str(r["model"]) for r in rows):
        design, seed = design_and_seed(model)
        if design and seed.isdigit():
            seeds.setdefault(design, []).append(seed)
    out = list(rows)
    for design, found in seeds.items():
        if len(found) > 1:
            name = f"{design}, seeds {'+'.join(found)}"
            out += [{**r, "model": name} for r in rows
                    if design_and_seed(str(r["model"]))[0] == design]  # fmt: skip
    return out


def audit_table(reports: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """One row per judge setting from ``grpokit judge audit --output`` files."""
    lines = [
        "| judge setting | good answers' mean | repeat spread of the reward (std per answer) | "
        "spread across answers | planted bad, mean | separation P(good > bad) | parse failures |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, report in reports:
        judges = report["judges"]
        noise = float(report["reward_noise"])  # after the ensemble's mean, if one
        spread = mean_or_nan([j["spread"] for j in judges])
        parse = mean_or_nan([j["parse_failure_rate"] for j in judges])
        planted = mean_or_nan([p["mean"] for p in report["planted"]])
        lines.append(
            f"| {label} | {_f(report['ensemble_mean'], 3)} | {_f(noise, 3)} | {_f(spread, 3)} | "
            f"{_f(planted, 3)} | {_f(report.get('separation', math.nan))} | {_f(parse)} |"
        )
    return "\n".join(lines)


def plot_runs(runs: Sequence[RunCurves], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"gated": "tab:blue", "summed": "tab:orange"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    panels = (
        ("format pass rate", "format_pass"),
        ("judge mean (completions it scored)", "judge"),
        ("total reward", "reward"),
    )
    for ax, (title, attr) in zip(axes, panels, strict=True):
        for run in runs:
            values = getattr(run, attr)
            ax.plot(
                range(1, len(values) + 1),
                _smooth(values),
                color=colours.get(run.variant, "grey"),
                alpha=0.8,
                label=f"{run.variant} seed {run.seed}",
            )
        ax.set_title(title + " (moving mean of 5 steps)", fontsize=9)
        ax.set_xlabel("step")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(runs), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _smooth(values: Sequence[float], width: int = 5) -> list[float]:
    out = []
    for i in range(len(values)):
        out.append(mean_or_nan(values[max(0, i - width + 1) : i + 1]))
    return out


def _summary_command(args: argparse.Namespace) -> None:
    root = Path(args.dir)
    runs = [
        run_curves(p) for p in sorted(root.glob("*-s[0-9]*")) if (p / "metrics.jsonl").is_file()
    ]
    sections = ["## Training (per step: 1 prompt x 4 completions)", training_table(runs)]
    completions = root / "eval" / "completions.jsonl"
    if completions.is_file():
        results = heldout_results(completions)
        sections += ["## Held-out (judge scores every sample)", heldout_table(results)]
        sections.append(variant_means(results))
        rows = read_jsonl(completions)
        if all("prompt_index" in r for r in rows):  # grpokit eval writes it
            sections += ["## Held-out, paired against the start", paired_table(rows)]
            designs = pooled_rows(rows)[len(rows) :]
            if designs:
                start = [r for r in rows if r["model"] == rows[0]["model"]]
                sections += [
                    "## Held-out per design (seeds pooled), paired against the start",
                    paired_table(start + designs),
                ]
    reports = []
    for path in sorted((root / "audit").glob("*.json")):
        reports.append((path.stem, json.loads(path.read_text())))
    if reports:
        sections += ["## Judge audit", audit_table(reports)]
    text = "\n\n".join(sections) + "\n"
    (root / "summary.md").write_text(text)
    print(text)
    if runs:
        plot_runs(runs, root / "curves.png")
        print(f"figure: {root / 'curves.png'}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demos = sub.add_parser("demos", help="format demonstrations from the model's own samples")
    demos.add_argument("--samples", required=True, help="grpokit generate --out file")
    demos.add_argument("--out", required=True)
    demos.add_argument("--tags", nargs=2, default=["thinking", "proposal"])
    demos.add_argument("--max-words", type=int, default=60)
    demos.add_argument("--min-sentences", type=int, default=2)
    demos.add_argument("--min-demos", type=int, default=16)
    demos.set_defaults(func=_demos_command)
    configs = sub.add_parser("audit-configs", help="one config per judge setting to audit")
    configs.add_argument("config", help="the recipe's config.openai.en.yaml")
    configs.add_argument("out", help="directory for the configs")
    configs.set_defaults(func=_audit_configs_command)
    lists = sub.add_parser("checklist-configs", help="the checklist design's configs")
    lists.add_argument("recipe", help="the recipe copy (judge_gate.sh's OUT/recipe)")
    lists.add_argument("url", help="the judge server's base URL")
    lists.add_argument("--eval-config", default="eval.en.yaml", help="in the recipe copy")
    lists.set_defaults(func=_checklist_configs_command)
    summary = sub.add_parser("summary", help="tables and figures of a judge_gate.sh directory")
    summary.add_argument("dir")
    summary.set_defaults(func=_summary_command)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
