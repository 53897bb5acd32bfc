"""`grpokit preflight`: sample, measure, decide, print and write preflight.json."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from grpokit.config import GRPOKitConfig
from grpokit.files import write_json
from grpokit.preflight.inputs import draw_record, reward_infos, tool_info
from grpokit.preflight.measure import Measurement, measure
from grpokit.preflight.report import preflight_json, render
from grpokit.preflight.verdict import Verdict, decide
from grpokit.sampling import Sampler, ScoredBatch
from grpokit.sampling.groups import choose_prompts, open_sampler, sample_groups

DEFAULT_PROMPTS = 8


@dataclass
class PreflightResult:
    measurement: Measurement
    verdict: Verdict
    path: Path
    document: dict[str, Any]


def default_output(cfg: GRPOKitConfig, checkpoint: Path | None) -> Path:
    """preflight.json in the run directory; preflight-<checkpoint>.json for a checkpoint, so the
    measurement a run starts from is not overwritten by the one after training."""
    if checkpoint is None:
        return cfg.output_dir / "preflight.json"
    name = checkpoint.resolve().name
    if name == "model":
        name = checkpoint.resolve().parent.name
    return cfg.output_dir / f"preflight-{name}.json"


def run_preflight(
    cfg: GRPOKitConfig,
    *,
    prompts: int = DEFAULT_PROMPTS,
    generations: int | None = None,
    seed: int | None = None,
    checkpoint: Path | None = None,
    out: Path | None = None,
    console: Console | None = None,
) -> PreflightResult:
    """Sample `generations` completions (default: training.num_generations) for `prompts`
    training prompts with the configured model (or `checkpoint`), score them with the configured
    rewards, print the table, forecast and verdict, and write the JSON to `out` (a directory
    gets preflight.json inside it; default: the run directory)."""
    console = console or Console()
    g = generations if generations is not None else cfg.training.num_generations
    seed = cfg.training.seed if seed is None else seed
    t0 = time.perf_counter()
    sampler, train_rows = open_sampler(cfg, checkpoint=checkpoint)
    init_from = sampler.policy.init_from
    try:
        rows = choose_prompts(train_rows, prompts, seed=seed)
        console.print(
            f"preflight: sampling {len(rows)} prompts x {g} generations from "
            f"{init_from or cfg.model.name_or_path} "
            f"(max {cfg.training.max_completion_length} new tokens) ...",
            markup=False,
        )
        batches = sample_groups(sampler, cfg, rows, g, seed=seed)
        infos = reward_infos(cfg, sampler.rewards)
        settings = draw_record(sampler, cfg, len(rows), g, seed)
        tools = tool_info(sampler, cfg)
    finally:
        sampler.rewards.close()
    m = measure(batches, infos, settings, tools=tools)
    v = decide(m)
    render(m, v, console)
    if out is None:
        path = default_output(cfg, checkpoint)
    else:
        path = out / "preflight.json" if (out.is_dir() or not out.suffix) else out
    meta = {
        "config": str(cfg.config_path) if cfg.config_path else None,
        "model": cfg.model.name_or_path,
        "init_from": init_from,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    doc = preflight_json(m, v, meta=meta)
    write_json(path, doc)
    console.print(f"written: {path}", markup=False)
    return PreflightResult(m, v, path, doc)


def advice_on_steps(cfg: GRPOKitConfig, sampler: Sampler, batches: list[ScoredBatch]) -> list[str]:
    """preflight's reasons and advice on a training run's own samples (steps whose every group
    had equal rewards): the trainer's warning then says what to do in the words and with the
    numbers `grpokit preflight` would print."""
    g = batches[0].group_size
    prompts = sum(len(b.rows) for b in batches)
    settings = draw_record(sampler, cfg, prompts, g, cfg.training.seed)
    verdict = decide(measure(batches, reward_infos(cfg, sampler.rewards), settings))
    return [*verdict.reasons, *verdict.advice]
