"""`grpokit demo`: the whole workflow on the embedded model, on a laptop CPU, in about 10 minutes.

Task: two-digit addition answered as <thinking>...</thinking><answer>N</answer>. The base model
almost never produces that format (the cold start: every reward 0, nothing to learn from), so the
demo warm-starts it with a short SFT on generated demonstrations, then trains with GRPO from that
checkpoint (which also becomes the KL reference), and measures held-out pass rates at each stage.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from rich.console import Console
from rich.table import Table

from grpokit.config import EMBEDDED_MODEL, GRPOKitConfig, ModelConfig, load_config
from grpokit.core.forecast import forecast, std_normalized_for
from grpokit.core.losses import LossTypeName
from grpokit.core.stats import cluster_pass_summary, paired_difference
from grpokit.data.prompts import PromptRow, load_prompts
from grpokit.data.tasks import (
    ARITHMETIC_SYSTEM_PROMPT,
    arithmetic_demonstration,
    arithmetic_row,
    fresh_arithmetic_problems,
    fresh_multiplication_problems,
    multiplication_row,
    write_arithmetic_task,
)
from grpokit.errors import UserError
from grpokit.files import write_jsonl
from grpokit.rewards.compose import RewardSet, build_reward_set
from grpokit.rewards.registry import BuildContext
from grpokit.sampling import Sampled, Sampler
from grpokit.train.sft import load_demonstrations, run_sft
from grpokit.train.trainer import GRPOTrainer

HELDOUT_SEED = 1234
EVAL_CHUNK = 32
"""Held-out prompts sampled at once: bounds the KV cache of a large held-out set."""


@dataclass(frozen=True)
class DemoSettings:
    """What the demo's result depends on. The defaults were chosen by measuring each change on
    200 fresh problems (docs/demo.md); ``bench/demo_experiments.py`` reruns those experiments."""

    model: str = EMBEDDED_MODEL
    """The model trained: a named model (``grpokit models``), a model folder or a GGUF file."""
    system_prompt: str = ARITHMETIC_SYSTEM_PROMPT
    """What the model is asked for, in the SFT and in GRPO."""
    demonstration: Callable[[int, int], dict[str, str]] = arithmetic_demonstration
    """Writes the worked answer of a + b that the SFT imitates."""
    n_demos: int = 384
    sft_steps: int = 48
    """0: no SFT; GRPO starts from the model itself (one that already follows the format)."""
    sft_batch_size: int = 8
    sft_learning_rate: float = 5e-5
    grpo_steps: int = 20
    lora_r: int | None = 16
    """GRPO's LoRA rank; None trains every weight."""
    learning_rate: float = 2e-4
    lr_scheduler_type: Literal["constant", "constant_with_warmup", "linear", "cosine"] = "constant"
    num_generations: int = 8
    prompts_per_step: int = 2
    max_completion_length: int = 64
    beta: float = 0.04
    loss_type: LossTypeName = "dapo"
    temperature: float = 1.0
    dynamic_sampling: bool = False
    curriculum: dict[str, float] | None = None
    """training.curriculum (e.g. {} for its defaults, {"easy_keep_prob": 0.2}); None: off."""
    n_train: int = 256
    """GRPO's training prompts (at most 256: fresh problems avoid that many). Fewer make prompts
    recur within a run, which a curriculum needs (20 steps x 2 prompts meet 40 of 256 once)."""
    n_heldout: int = 32
    n_eval: int = 200
    """Measure every stage on this many fresh problems (disjoint from anything the demo's data can
    hold, ``fresh_arithmetic_problems``) instead of heldout.jsonl; 0: heldout.jsonl."""
    eval_samples: int = 1
    grpo_eval_steps: int = 0
    """Held-out checks during GRPO every N steps (the curve in metrics.jsonl); 0: none."""
    seed: int = 0
    """Seeds the SFT's order and GRPO's sampling; the problems stay the same."""
    dtype: Literal["auto", "float32"] = "auto"
    """``model.dtype`` of both stages: "auto" computes in bfloat16 (float32 weights and optimizer
    state) where the CPU multiplies bfloat16 natively, float32 elsewhere."""

    def describe(self) -> dict[str, Any]:
        """The settings as plain values (the demonstration by its function's name)."""
        out = asdict(self)
        out["demonstration"] = self.demonstration.__name__
        return out


DEMO = DemoSettings()
LONG = replace(DEMO, n_demos=512, sft_steps=64, grpo_steps=40, eval_samples=2, dtype="float32")
"""Measured in docs/demo.md: a longer SFT on more demonstrations, then twice the GRPO steps, in
float32, each problem answered twice."""
QUICK = replace(DEMO, n_demos=64, sft_steps=4, grpo_steps=2, n_heldout=8, n_eval=0, eval_samples=2)
REAL_MODEL = "qwen2.5-coder-0.5b-instruct"
REAL_SYSTEM_PROMPT = (
    "You are a careful calculator. First add the numbers step by step, writing your working "
    "between <thinking> and </thinking>. Then write the result alone between <answer> and "
    "</answer>."
)
"""The format described, not shown: given the embedded demo's template ("<thinking>your
working</thinking>"), an instruct model that needs no SFT learns under GRPO to copy the
placeholder and drop its working (3 of 4 runs, docs/demo.md)."""
REAL = replace(DEMO, model=REAL_MODEL, system_prompt=REAL_SYSTEM_PROMPT, sft_steps=0, grpo_steps=30)
"""``grpokit demo --model NAME``, measured on Qwen2.5-Coder-0.5B-Instruct (docs/demo.md): it follows
the format in about 2 of 5 answers from the start, so GRPO starts from the model itself, LoRA r 16
on the demo's settings."""


def settings_for(model: str | None, *, quick: bool = False, long_run: bool = False) -> DemoSettings:
    """The demo's settings for ``grpokit demo [--model NAME] [--quick | --long]``."""
    if model is None or model == EMBEDDED_MODEL:
        return QUICK if quick else LONG if long_run else DEMO
    if long_run:
        raise UserError("grpokit demo --long: a longer run of the embedded model; not with --model")
    if quick:
        return replace(QUICK, model=model, system_prompt=REAL_SYSTEM_PROMPT, sft_steps=0)
    return replace(REAL, model=model)


def demo_config(data_dir: Path, sft_dir: Path, s: DemoSettings) -> dict[str, Any]:
    """The GRPO config of the demo (written to ``grpo.yaml`` beside its runs)."""
    completions = s.num_generations * s.prompts_per_step
    micro_batch = math.gcd(completions, 8)  # micro-batches of at most 8 completions
    return {
        "model": {
            "name_or_path": s.model,
            "dtype": s.dtype,
            "init_from": str(sft_dir) if s.sft_steps else None,
            "lora": {"r": s.lora_r, "alpha": 2 * s.lora_r, "dropout": 0.0} if s.lora_r else None,
        },
        "data": {
            "train": str(data_dir / "train.jsonl"),
            "heldout": str(data_dir / "heldout.jsonl"),
            "system_prompt": s.system_prompt,
        },
        "rewards": [
            {"type": "xml_format", "name": "format", "tags": ["thinking", "answer"]},
            {
                "type": "math_answer",
                "name": "answer",
                "answer_column": "answer",
                "gate": {"reward": "format", "min": 1.0},
            },
        ],
        "training": {
            "learning_rate": s.learning_rate,
            "max_steps": s.grpo_steps,
            "num_generations": s.num_generations,
            "per_device_train_batch_size": micro_batch,
            "gradient_accumulation_steps": completions // micro_batch,
            "max_completion_length": s.max_completion_length,
            "temperature": s.temperature,
            "beta": s.beta,
            "loss_type": s.loss_type,
            "dynamic_sampling": s.dynamic_sampling,
            **({"curriculum": s.curriculum} if s.curriculum is not None else {}),
            "lr_scheduler_type": s.lr_scheduler_type,
            "seed": s.seed,
            "save_steps": 0,
            "report_to": ["tensorboard"],
            **(
                {
                    "eval_steps": s.grpo_eval_steps,
                    "eval_max_prompts": s.n_heldout,
                    "eval_samples": 2,
                }
                if s.grpo_eval_steps
                else {}
            ),
        },
    }


@dataclass(frozen=True)
class StageResult:
    """One reward on the held-out set: passes with the 95% cluster interval over prompts."""

    name: str
    passed: int
    n: int
    low: float
    high: float

    @property
    def rate(self) -> float:
        return self.passed / self.n if self.n else math.nan

    def cell(self) -> str:
        return f"{self.passed}/{self.n}  [{self.low:.2f}, {self.high:.2f}]"


def heldout_pass_rates(sampler: Sampler, rows: list[PromptRow], *, samples: int) -> Sampled:
    """Each held-out prompt answered ``samples`` times with fixed seeds, scored: the same draws
    for every stage, so the stages differ only by their weights."""
    return sampler.score_prompts(rows, samples, seed=HELDOUT_SEED, prompts_per_chunk=EVAL_CHUNK)


def stage_results(sampled: Sampled) -> list[StageResult]:
    """Each reward's passes over the held-out samples (every demo reward has a maximum)."""
    out = []
    for j, name in enumerate(sampled.batches[0].scores.names):
        passed, n, lo, hi = cluster_pass_summary(sampled.passes(j))
        out.append(StageResult(name, passed, n, lo, hi))
    return out


def paired_gain(before: Sampled, after: Sampled, reward: int) -> tuple[float, float, float]:
    """after's pass rate of one reward minus before's, paired over prompts: (mean, low, high).

    Both were sampled on the same prompts with the same seeds, so pairing each prompt's two pass
    rates removes its difficulty from the interval (``paired_difference``, per-prompt means).
    """
    pairs = [
        (sum(a) / len(a), sum(b) / len(b))
        for a, b in zip(after.passes(reward), before.passes(reward), strict=True)
        if a and b
    ]
    return paired_difference([a for a, _ in pairs], [b for _, b in pairs])


def forecast_against_grpo(
    sft: list[StageResult],
    grpo: list[StageResult] | None,
    *,
    beta: float,
    scale_rewards: str,
) -> list[dict[str, Any]]:
    """Per reward: the success-amplification forecast (docs/math.md 5) from the SFT checkpoint's
    held-out pass rate, with the bounds its interval gives, beside the pass rate the GRPO
    checkpoint measured on the same problems and seeds (when there is one)."""
    std = std_normalized_for(scale_rewards)
    out: list[dict[str, Any]] = []
    for j, start in enumerate(sft):
        f = forecast(start.rate, (start.low, start.high), beta=beta, std_normalized=std)
        row: dict[str, Any] = {
            "reward": start.name,
            "p_ref": start.rate,
            "forecast": f.p_star,
            "forecast_low": f.p_star_low,
            "forecast_high": f.p_star_high,
        }
        if grpo is not None:
            measured = grpo[j]
            row |= {"measured": measured.rate, "low": measured.low, "high": measured.high}
        out.append(row)
    return out


def _percent(value: float | None) -> str:
    return "?" if value is None or math.isnan(value) else f"{value:.0%}"


@contextmanager
def _timed(seconds: dict[str, float], part: str) -> Iterator[None]:
    """Records the block's wall-clock seconds in ``seconds[part]`` and the CPU seconds of all its
    threads in ``seconds["<part> cpu"]`` (their ratio shows how many cores it kept busy)."""
    t, cpu = time.perf_counter(), time.process_time()
    yield
    seconds[part] = time.perf_counter() - t
    seconds[f"{part} cpu"] = time.process_time() - cpu


@dataclass
class Measurements:
    """A demo run's held-out measurements, stage by stage, and how long each part took."""

    rows: list[PromptRow]
    """The problems every stage answers, with the same seeds."""
    samples_per_prompt: int
    samples_file: Path
    """heldout_samples.jsonl: every held-out completion so far, rewritten after each stage."""
    results: dict[str, list[StageResult]] = field(default_factory=dict)
    sampled: dict[str, Sampled] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall-clock seconds of each part, and "<part> cpu": the CPU seconds of all its threads."""

    @contextmanager
    def timed(self, part: str) -> Iterator[None]:
        with _timed(self.seconds, part):
            yield

    def measure(self, stage: str, sampler: Sampler) -> list[StageResult]:
        """``sampler``'s pass rates on the held-out problems, recorded as ``stage``."""
        with self.timed(f"eval {stage}"):
            sampled = heldout_pass_rates(sampler, self.rows, samples=self.samples_per_prompt)
        self.sampled[stage] = sampled
        self.results[stage] = stage_results(sampled)
        self.samples.extend(
            {"prompt": self.rows[x.prompt_index].prompt, **asdict(x)}
            for x in sampled.samples(stage)
        )
        write_jsonl(self.samples_file, self.samples)
        return self.results[stage]


@dataclass(frozen=True)
class _DemoRun:
    """What the stages of one demo run share."""

    settings: DemoSettings
    output_dir: Path
    cfg: GRPOKitConfig
    rewards: RewardSet
    measurements: Measurements
    console: Console

    def load_model(self, *, init_from: Path | None = None) -> Sampler:
        """The model in full (SFT trains every weight), sampled as the GRPO run will sample."""
        cfg = self.cfg
        return Sampler.load(
            ModelConfig(
                name_or_path=cfg.model.name_or_path,
                dtype=cfg.model.dtype,
                init_from=str(init_from) if init_from else None,
            ),
            self.rewards,
            sampling=cfg.training.sampling_params,
            system_prompt=cfg.system_prompt,
            max_prompt_length=cfg.training.max_prompt_length,
            base_dir=self.output_dir,
        )


def run_demo(
    output_dir: Path,
    settings: DemoSettings = DEMO,
    *,
    measure_base: bool = True,
    sft_from: Path | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Base model -> SFT -> GRPO with held-out pass rates after each stage; returns the summary
    also written to ``demo_summary.json`` (every held-out completion: ``heldout_samples.jsonl``).

    measure_base: also measure the base model (it never follows the format).
    sft_from: the ``sft`` checkpoint of an earlier run with the same SFT settings, copied instead
        of trained again (experiments on the GRPO stage).
    With ``settings.grpo_steps`` 0 the demo stops after the SFT.
    """
    run, demos = _start(output_dir.resolve(), settings, console or Console())
    s = settings
    t0 = time.perf_counter()
    base = run.load_model()
    if measure_base or not s.sft_steps:  # without an SFT, GRPO's gain is measured from the base
        _measure_base(run, base)
    history, sft_entropy = _sft_stage(run, base, demos, sft_from)
    del base  # freed before GRPO loads its own copy
    summary: dict[str, Any] = {
        "settings": s.describe(),
        "sft_entropy": sft_entropy,
        "sft_history": history,
    }
    if s.grpo_steps:
        summary |= _grpo_stage(run)
    run.measurements.seconds["total"] = time.perf_counter() - t0
    summary |= _report(run, summary)
    (run.output_dir / "demo_summary.json").write_text(json.dumps(summary, indent=2))
    run.rewards.close()
    return summary


def _start(output_dir: Path, s: DemoSettings, console: Console) -> tuple[_DemoRun, Path]:
    """Writes the task's files and the GRPO config (grpo.yaml); returns the run and the SFT's
    demonstrations."""
    data_dir = output_dir / "data"
    paths = write_arithmetic_task(
        data_dir,
        n_train=s.n_train,
        n_heldout=s.n_heldout,
        n_demos=s.n_demos,
        demonstration=s.demonstration,
    )
    cfg_path = output_dir / "grpo.yaml"
    cfg_path.write_text(
        yaml.safe_dump(demo_config(data_dir, output_dir / "sft", s), sort_keys=False)
    )
    cfg = load_config(cfg_path)
    rewards = build_reward_set(cfg.rewards, BuildContext(base_dir=output_dir, run_dir=None, seed=0))
    if s.n_eval:
        fresh = [arithmetic_row(a, b) for a, b in fresh_arithmetic_problems(s.n_eval)]
        rows = load_prompts(write_jsonl(data_dir / f"fresh{s.n_eval}.jsonl", fresh))
    else:
        rows = load_prompts(paths["heldout"])
    console.rule("[bold]grpokit demo: two-digit addition with <thinking>/<answer> tags")
    console.print(f"files in {output_dir}; GRPO config {cfg_path}")
    measurements = Measurements(rows, s.eval_samples, output_dir / "heldout_samples.jsonl")
    return _DemoRun(s, output_dir, cfg, rewards, measurements, console), paths["demos"]


def _measure_base(run: _DemoRun, base: Sampler) -> None:
    s, console = run.settings, run.console
    console.print(
        f"[bold]1/4[/] base model on {len(run.measurements.rows)} held-out problems, "
        f"{_answers(s.eval_samples)}"
    )
    base_format, base_answer = run.measurements.measure("base model", base)
    console.print(f"  format followed: {base_format.cell()}, answer {base_answer.cell()}")
    if not base_format.passed:
        console.print(
            "  [yellow]cold start[/]: the base model never follows the format, so every "
            "reward is 0 and GRPO has no signal. "
            + (
                "Warm-starting with a short SFT on generated demonstrations (grpokit sft "
                "does the same for your task)."
                if s.sft_steps
                else "Without an SFT (sft_steps 0) GRPO will not learn."
            )
        )


def _sft_stage(
    run: _DemoRun, base: Sampler, demos: Path, sft_from: Path | None
) -> tuple[list[dict[str, Any]], float]:
    """The SFT warm-start of ``base``'s model on ``demos``, saved to the run's sft/ and measured:
    its history and its last entropy. With sft_steps 0 there is none: GRPO starts from the model
    itself."""
    s, console = run.settings, run.console
    if not s.sft_steps:
        console.print("[bold]2/4[/] SFT warm-start: none; GRPO starts from the model itself")
        return [], math.nan
    console.print(f"[bold]2/4[/] SFT warm-start: {s.sft_steps} steps on {demos.name}")
    sft_dir = run.output_dir / "sft"
    with run.measurements.timed("sft"):
        if sft_from is not None:
            history = _copy_sft(sft_from, sft_dir)
            trained = run.load_model(init_from=sft_dir)
        else:
            history = run_sft(
                base.policy.model,
                base.policy.tokenizer,
                load_demonstrations(demos),
                base.policy.trainable_parameters(),
                system_prompt=s.system_prompt,
                max_steps=s.sft_steps,
                batch_size=s.sft_batch_size,
                learning_rate=s.sft_learning_rate,
                seed=s.seed,
                log=lambda m: console.print("  " + m),
            )
            base.policy.save(sft_dir)
            trained = base
    sft = run.measurements.measure("after SFT", trained)
    entropy: float = history[-1]["entropy"]
    console.print(
        f"  format {sft[0].cell()}, answer {sft[1].cell()}, entropy {entropy:.2f} "
        f"nats/token (low, yet the digits that decide an answer still vary, so GRPO's groups "
        f"do)"
    )
    return history, entropy


def _copy_sft(sft_from: Path, sft_dir: Path) -> list[dict[str, Any]]:
    """An earlier run's SFT checkpoint, copied to ``sft_dir``; returns that run's SFT history."""
    earlier = json.loads((sft_from.parent / "demo_summary.json").read_text())
    # A summary written before the history was kept has the last entropy alone.
    history: list[dict[str, Any]] = earlier.get("sft_history") or [
        {"entropy": earlier["sft_entropy"]}
    ]
    if sft_dir.exists():
        shutil.rmtree(sft_dir)
    shutil.copytree(sft_from, sft_dir)
    return history


def _grpo_stage(run: _DemoRun) -> dict[str, Any]:
    """GRPO as grpo.yaml says, then measured: what the summary keeps of its training."""
    s, console = run.settings, run.console
    kind = f"LoRA r {s.lora_r}" if s.lora_r else "full fine-tuning"
    start = "the SFT checkpoint" if s.sft_steps else "the model itself"
    console.print(f"[bold]3/4[/] GRPO: {s.grpo_steps} steps from {start} ({kind})")
    with run.measurements.timed("grpo"):
        trainer = GRPOTrainer(
            run.cfg, run_dir=run.output_dir / "grpo", progress=True, log=console.print
        )
        result = trainer.train()
    console.print("[bold]4/4[/] trained model on the same held-out problems and seeds")
    run.measurements.measure("after GRPO", replace(trainer.sampler, rewards=run.rewards))
    return {
        **_training_summary(result.history),
        "run_dir": str(result.run_dir),
        "checkpoint": str(result.checkpoint),
    }


def _report(run: _DemoRun, summary: dict[str, Any]) -> dict[str, Any]:
    """Prints every stage's pass rates, GRPO's gain, the forecast beside what GRPO measured, the
    training reward and the time taken; returns what the summary adds of them."""
    m, console, train = run.measurements, run.console, run.cfg.training
    # The stage GRPO starts from, against which its gain is measured.
    start = "after SFT" if run.settings.sft_steps else "base model"
    console.print(_pass_rate_table(m))
    out: dict[str, Any] = {}
    if "after GRPO" in m.sampled:
        answer = len(m.results["after GRPO"]) - 1
        gain = paired_gain(m.sampled[start], m.sampled["after GRPO"], answer)
        out["grpo_gain"] = {"mean": gain[0], "low": gain[1], "high": gain[2]}
        console.print(
            f"{m.results['after GRPO'][answer].name}: after GRPO - {start} = {gain[0]:+.3f} "
            f"[{gain[1]:+.3f}, {gain[2]:+.3f}] (paired over the {len(m.rows)} problems, 95%)"
        )
    out["forecast"] = forecast_against_grpo(
        m.results[start],
        m.results.get("after GRPO"),
        beta=train.beta,
        scale_rewards=train.scale_rewards,
    )
    for row in out["forecast"]:
        console.print(_forecast_line(row, start, train.beta))
    if "reward_late" in summary:
        k = summary["reward_window"]
        console.print(
            f"training reward: first {k} steps {summary['reward_early']:.3f} -> last {k} steps "
            f"{summary['reward_late']:.3f}; monitor alerts: {len(summary['alerts'])}; curve in "
            f"{Path(summary['run_dir']) / 'metrics.jsonl'}"
        )
    stages = ", ".join(
        f"{n} {m.seconds[k]:.0f} s" for n, k in (("SFT", "sft"), ("GRPO", "grpo")) if k in m.seconds
    )
    console.print(
        f"total time {m.seconds['total']:.0f} s ({stages}); load average {os.getloadavg()[0]:.2f}"
    )
    out["stages"] = {name: [asdict(r) for r in stage] for name, stage in m.results.items()}
    out["seconds"] = m.seconds
    return out


def _pass_rate_table(m: Measurements) -> Table:
    table = Table(
        title=f"held-out pass rates ({len(m.rows)} problems, {_answers(m.samples_per_prompt)}; "
        f"95% cluster interval over prompts)"
    )
    table.add_column("model")
    for r in next(iter(m.results.values())):
        table.add_column(r.name)
    for name, stage in m.results.items():
        table.add_row(name, *[r.cell() for r in stage])
    return table


def _forecast_line(row: dict[str, Any], start: str, beta: float) -> str:
    line = (
        f"{row['reward']}: forecast from the {start.removeprefix('after ')}'s "
        f"{_percent(row['p_ref'])} at beta "
        f"{beta:g}: {_percent(row['forecast'])} [{_percent(row['forecast_low'])}, "
        f"{_percent(row['forecast_high'])}]"
    )
    if "measured" in row:
        line += f"; after GRPO {_percent(row['measured'])} [{row['low']:.2f}, {row['high']:.2f}]"
    return line


def _answers(samples: int) -> str:
    return "one answer each" if samples == 1 else f"{samples} answers each"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _training_summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The training reward early and late, and the monitors' alerts."""
    curve = [h["reward"] for h in history if not math.isnan(h.get("reward", math.nan))]
    k = max(1, len(curve) // 4)
    return {
        "reward_window": k,
        "reward_early": sum(curve[:k]) / k,
        "reward_late": sum(curve[-k:]) / k,
        # groups of a step's first generation round whose rewards were all equal (no signal)
        "zero_std_share": _mean(
            [h["frac_reward_zero_std"] for h in history if "frac_reward_zero_std" in h]
        ),
        "alerts": [a for h in history for a in h.get("alerts", [])],
    }


# `grpokit demo --tools`: the tool-arithmetic recipe, learned live.

TOOL_RECIPE = "tool-arithmetic"


@dataclass(frozen=True)
class ToolDemoSettings:
    """What the tool demo's result depends on (measured in docs/demo.md); the recipe's
    config.yaml holds the rest."""

    sft_steps: int = 8
    sft_batch_size: int = 8
    sft_learning_rate: float = 1e-3
    sft_lora: bool = True
    """SFT a LoRA adapter (the config's) with gradient checkpointing: a full fine-tuning's
    weights, gradients and optimizer state, and the activations of 8 prompts of 200 tokens,
    took 6-7 GB, more than a shared machine could spare."""
    grpo_steps: int = 6
    learning_rate: float = 2e-4
    num_generations: int = 8
    prompts_per_step: int = 2
    max_completion_length: int = 96
    """Over all turns: a call (about 35 tokens), its result (25) and the answer (12)."""
    max_tool_calling_iterations: int = 2
    n_eval: int = 200
    """Measure every stage on this many fresh products (in none of the recipe's files); 0: on
    the recipe's heldout.jsonl (the validation set the settings were chosen on)."""
    seed: int = 0
    """Seeds the SFT's order and GRPO's sampling; the problems stay the same."""

    def overrides(self) -> list[str]:
        """The recipe config's settings these replace, as ``--set`` overrides."""
        completions = self.num_generations * self.prompts_per_step
        micro_batch = math.gcd(completions, 8)
        t = "training."
        return [
            f"{t}learning_rate={self.learning_rate}",
            f"{t}max_steps={self.grpo_steps}",
            f"{t}num_generations={self.num_generations}",
            f"{t}per_device_train_batch_size={micro_batch}",
            f"{t}gradient_accumulation_steps={completions // micro_batch}",
            f"{t}max_completion_length={self.max_completion_length}",
            f"{t}max_tool_calling_iterations={self.max_tool_calling_iterations}",
            f"{t}seed={self.seed}",
            f"{t}save_steps=0",
            f"{t}eval_steps=0",
            f"{t}report_to=[]",
        ]


TOOL_DEMO = ToolDemoSettings()
TOOL_QUICK = replace(TOOL_DEMO, grpo_steps=2, n_eval=0)
"""The slow test's run: the same SFT, 2 GRPO steps, measured on the recipe's 32 validation
products."""

TOOL_COLUMNS = ("with the tool", "without")
TOOL_SCORED = "answer"
"""The recipe's reward the tool demo reports: the product is right (``number``, its gate, only
says an integer stands in the ``<answer>`` tag, which the model writes with or without the tool)."""


def _scored(sampled: Sampled) -> int:
    """The index of :data:`TOOL_SCORED` among the sampled rewards."""
    return sampled.batches[0].scores.names.index(TOOL_SCORED)


@dataclass
class ToolMeasurements:
    """The tool demo's held-out measurements: each stage with the calculator and without it, and
    how long each part took."""

    rows: list[PromptRow]
    """The products every stage answers, with the same seeds."""
    samples_file: Path
    """heldout_samples.jsonl: every held-out transcript so far, rewritten after each stage."""
    console: Console
    sampled: dict[tuple[str, str], Sampled] = field(default_factory=dict)
    """Per (stage, column of :data:`TOOL_COLUMNS`)."""
    samples: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall-clock seconds of each part, and "<part> cpu": the CPU seconds of all its threads."""
    load: dict[str, float] = field(default_factory=dict)
    """The load average at the end of each part: other work on the machine slows it down."""

    @contextmanager
    def timed(self, part: str) -> Iterator[None]:
        with _timed(self.seconds, part):
            yield
        self.load[part] = os.getloadavg()[0]

    def measure(self, stage: str, sampler: Sampler) -> None:
        """``sampler``'s answers on the held-out products with its tools and without them (the
        prompt then shows no tools, and a call the model writes anyway is not run), recorded
        and printed as ``stage``."""
        for column, tools in zip(TOOL_COLUMNS, (sampler.tools, None), strict=True):
            with self.timed(f"eval {stage}, {column}"):
                sampled = heldout_pass_rates(replace(sampler, tools=tools), self.rows, samples=1)
            self.sampled[stage, column] = sampled
            result = stage_results(sampled)[_scored(sampled)]
            self.console.print(f"  {stage}, {column}: {result.cell()}")
            self.samples.extend(
                {
                    "prompt": self.rows[x.prompt_index].prompt,
                    "tools": tools is not None,
                    **asdict(x),
                }
                for x in sampled.samples(stage)
            )
        write_jsonl(self.samples_file, self.samples)

    def stages(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Per stage and column: the :data:`TOOL_SCORED` reward's :class:`StageResult`, as a
        dict (the summary's ``stages``)."""
        stages: dict[str, dict[str, dict[str, Any]]] = {}
        for (stage, column), sampled in self.sampled.items():
            stages.setdefault(stage, {})[column] = asdict(stage_results(sampled)[_scored(sampled)])
        return stages


@dataclass(frozen=True)
class _ToolDemoRun:
    """What the stages of one tool demo run share."""

    settings: ToolDemoSettings
    output_dir: Path
    cfg: GRPOKitConfig
    """The recipe's config with the settings' overrides: what the base model is sampled with."""
    rewards: RewardSet
    measurements: ToolMeasurements
    console: Console

    @property
    def recipe(self) -> Path:
        """The recipe's copy, run as a user runs it."""
        return self.output_dir / "recipe"

    @property
    def sft_dir(self) -> Path:
        return self.output_dir / "sft"

    def config(self, *more: str) -> GRPOKitConfig:
        """The recipe's config with the settings' overrides and ``more``."""
        return load_config(self.recipe / "config.yaml", [*self.settings.overrides(), *more])


def run_tool_demo(
    output_dir: Path,
    settings: ToolDemoSettings = TOOL_DEMO,
    *,
    measure_base: bool = True,
    console: Console | None = None,
) -> dict[str, Any]:
    """The tool-arithmetic recipe, copied to ``output_dir/recipe`` and run as a user runs it:
    base model -> SFT on its tool-using demonstrations -> GRPO, each stage measured on fresh
    products with the calculator and without it (the prompt then shows no tools, and a call the
    model writes anyway is not run). Returns the summary also written to
    ``tool_demo_summary.json`` (every held-out transcript: ``heldout_samples.jsonl``).

    measure_base: also measure the base model (the same for every seed).
    """
    run = _start_tool_demo(output_dir.resolve(), settings, console or Console())
    if measure_base:
        run.console.print(f"[bold]1/4[/] base model on {len(run.measurements.rows)} fresh products")
        run.measurements.measure("base model", Sampler.from_config(run.cfg, run.rewards))
    summary: dict[str, Any] = {"settings": asdict(settings), "sft_history": _tool_sft_stage(run)}
    if settings.grpo_steps:
        summary |= _tool_grpo_stage(run)
    run.rewards.close()
    summary |= _tool_report(run)
    (run.output_dir / "tool_demo_summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _start_tool_demo(output_dir: Path, s: ToolDemoSettings, console: Console) -> _ToolDemoRun:
    """Copies the recipe (unless an earlier run did) and writes the fresh products measured."""
    from grpokit.recipes import copy_recipe

    recipe = output_dir / "recipe"
    if not recipe.exists():
        copy_recipe(TOOL_RECIPE, recipe)
    cfg = load_config(recipe / "config.yaml", s.overrides())
    rewards = build_reward_set(cfg.rewards, BuildContext(base_dir=cfg.config_dir, seed=0))
    if s.n_eval:
        fresh = [multiplication_row(a, b) for a, b in fresh_multiplication_problems(s.n_eval)]
        rows = load_prompts(write_jsonl(output_dir / f"fresh{s.n_eval}.jsonl", fresh))
    else:
        rows = load_prompts(recipe / "heldout.jsonl")
    console.rule("[bold]grpokit demo --tools: three-digit by two-digit products, with a calculator")
    measurements = ToolMeasurements(rows, output_dir / "heldout_samples.jsonl", console)
    return _ToolDemoRun(s, output_dir, cfg, rewards, measurements, console)


def _tool_sft_stage(run: _ToolDemoRun) -> list[dict[str, Any]]:
    """The SFT warm-start on the recipe's demonstrations, saved to the run's sft/ and measured:
    its history."""
    from grpokit.train.sft_run import run_sft_from_config

    s, console = run.settings, run.console
    console.print(f"[bold]2/4[/] SFT warm-start: {s.sft_steps} steps on the demonstrations")
    with run.measurements.timed("sft"):
        history = run_sft_from_config(
            run.config("model.gradient_checkpointing=true"),
            output=run.sft_dir,
            data=run.recipe / "demos.jsonl",
            steps=s.sft_steps,
            batch_size=s.sft_batch_size,
            learning_rate=s.sft_learning_rate,
            lora=s.sft_lora,
            seed=s.seed,
            log=lambda m: console.print("  " + m),
        ).history
    run.measurements.measure(
        "after SFT", Sampler.from_config(run.cfg, run.rewards, checkpoint=run.sft_dir)
    )
    return history


def _tool_grpo_stage(run: _ToolDemoRun) -> dict[str, Any]:
    """GRPO from the SFT checkpoint, then measured: what the summary keeps of its training."""
    console = run.console
    console.print(f"[bold]3/4[/] GRPO: {run.settings.grpo_steps} steps from the SFT checkpoint")
    grpo_cfg = run.config(f"model.init_from={run.sft_dir}")
    with run.measurements.timed("grpo"):
        trainer = GRPOTrainer(
            grpo_cfg, run_dir=run.output_dir / "grpo", progress=True, log=console.print
        )
        result = trainer.train()
    console.print("[bold]4/4[/] trained model on the same products and seeds")
    run.measurements.measure("after GRPO", replace(trainer.sampler, rewards=run.rewards))
    return {**_training_summary(result.history), "run_dir": str(result.run_dir)}


def _tool_report(run: _ToolDemoRun) -> dict[str, Any]:
    """Prints every stage's answers with the calculator and without it, what the calculator and
    GRPO gained and the time taken; returns what the summary adds of them."""
    m, console = run.measurements, run.console
    stages = m.stages()
    console.print(_tool_table(stages, len(m.rows)))
    gains = _tool_gains(run)
    seconds = m.seconds
    console.print(
        f"SFT {seconds['sft']:.0f} s"
        + (f", GRPO {seconds['grpo']:.0f} s" if "grpo" in seconds else "")
        + f"; load average {os.getloadavg()[0]:.2f}"
    )
    return {"gains": gains, "stages": stages, "seconds": seconds, "load": m.load}


def _tool_table(stages: dict[str, dict[str, dict[str, Any]]], n_rows: int) -> Table:
    table = Table(
        title=f"held-out answers correct ({n_rows} fresh products, one answer each; 95% "
        "cluster interval over prompts)"
    )
    table.add_column("model")
    for column in TOOL_COLUMNS:
        table.add_column(column)
    for stage, cells in stages.items():
        table.add_row(stage, *[StageResult(**cells[c]).cell() for c in TOOL_COLUMNS])
    return table


def _tool_gains(run: _ToolDemoRun) -> dict[str, dict[str, float]]:
    """What the calculator adds to the last model, and what GRPO added with it, paired over the
    products (printed as computed)."""
    m, grpo = run.measurements, bool(run.settings.grpo_steps)
    last = "after GRPO" if grpo else "after SFT"
    # name: (the stage before, its column, the stage after, measured with the calculator)
    compared = {f"{last}: with the tool - without": (last, "without", last)}
    if grpo:
        compared["with the tool: after GRPO - after SFT"] = ("after SFT", "with the tool", last)
    gains: dict[str, dict[str, float]] = {}
    for name, (before, column, after) in compared.items():
        scored = _scored(m.sampled[before, column])
        mean, low, high = paired_gain(
            m.sampled[before, column], m.sampled[after, "with the tool"], scored
        )
        gains[name] = {"mean": mean, "low": low, "high": high}
        run.console.print(
            f"{name}: {mean:+.3f} [{low:+.3f}, {high:+.3f}] (paired over the {len(m.rows)} "
            "problems, 95%)"
        )
    return gains
