"""``grpokit generate``: samples of several models side by side, with the same seeds and settings.

The quick look a user takes before and after training (the seed article's base-vs-trained check
by hand): every model answers the same prompts K times, prompt chunk c sampled with seed + c for
every model, so differences come from the weights and not from the randomness. With a config,
its rewards score each sample exactly as in training (:class:`grpokit.sampling.Sampler`).
For the statistics of a real comparison (intervals, pass@k, paired differences) use
``grpokit eval``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpokit.config import GRPOKitConfig, ModelConfig
from grpokit.data.chat import prompt_text
from grpokit.data.prompts import PromptRow, check_columns, load_prompts
from grpokit.errors import UserError
from grpokit.files import write_jsonl as write_records
from grpokit.rewards.compose import RewardSet
from grpokit.rewards.spec import RewardSpec, gate_order
from grpokit.rollout.base import SamplingParams
from grpokit.sampling import (
    Sample,
    Sampler,
    check_tools,
    resolve_device,
    resolve_model,
    tool_rollout,
    unique_labels,
)


@dataclass
class GenerateResult:
    """Every model's samples for every prompt (``samples`` is model-major, then prompt, then k)."""

    labels: list[str]
    paths: dict[str, str]
    prompts: list[str]
    samples_per_prompt: int
    seed: int
    sampling: dict[str, float | int]
    reward_names: list[str]
    samples: list[Sample]
    unscored: dict[str, str] = field(default_factory=dict)
    """Configured rewards that did not score, each with why (a column the prompts lack)."""

    def of(self, label: str, prompt_index: int) -> list[Sample]:
        """The samples of one model for one prompt, in sample order."""
        return [s for s in self.samples if s.model == label and s.prompt_index == prompt_index]

    def reward_means(self, label: str) -> dict[str, float | None]:
        """Per reward (and ``total``): the mean over this model's samples where it applied."""
        mine = [s for s in self.samples if s.model == label]
        out: dict[str, float | None] = {}
        for name in [*self.reward_names, "total"]:
            values = [s.total if name == "total" else s.rewards.get(name) for s in mine]
            present = [v for v in values if v is not None]
            out[name] = sum(present) / len(present) if present else None
        return out


def prompt_rows(
    prompts_file: Path | None, texts: Sequence[str], *, prompt_column: str = "prompt"
) -> list[PromptRow]:
    """The prompts to answer: a prompt file's rows, or ``--prompt`` texts (not both)."""
    if prompts_file is not None and texts:
        raise UserError("give either --prompts FILE or --prompt TEXT, not both")
    if prompts_file is not None:
        return load_prompts(prompts_file, prompt_column=prompt_column)
    rows = [PromptRow(prompt=t, source=f"--prompt {i + 1}") for i, t in enumerate(texts)]
    if not rows:
        raise UserError("give the prompts: --prompts FILE (.jsonl / .csv) or --prompt TEXT")
    if any(not t.strip() for t in texts):
        raise UserError("--prompt: an empty prompt; give some text")
    return rows


def scorable(
    specs: Sequence[RewardSpec], columns_of: Mapping[str, frozenset[str]], have: set[str]
) -> tuple[list[RewardSpec], dict[str, str]]:
    """The rewards that can score prompts with the columns ``have``, and why each other one
    cannot: it reads a column they lack, or it depends (a gate, a reward it reads) on one that
    cannot score."""
    why: dict[str, str] = {}
    for spec in (specs[i] for i in gate_order(specs)):
        name = spec.display_name
        absent = sorted(columns_of[name] - have)
        lost = [d for d in spec.depends_on if d in why]
        if absent:
            why[name] = f"needs the column(s) {', '.join(absent)}"
        elif lost:
            why[name] = f"depends on {lost[0]!r}, which is not scored"
    return [s for s in specs if s.display_name not in why], why


def generate_samples(
    models: Sequence[str],
    rows: list[PromptRow],
    *,
    samples: int,
    sampling: SamplingParams,
    seed: int = 0,
    system_prompt: str | None = None,
    max_prompt_length: int | None = None,
    reward_set: RewardSet | None = None,
    device: str = "auto",
    batch_size: int = 32,
    model_config: ModelConfig | None = None,
    config: GRPOKitConfig | None = None,
    log: Callable[[str], None] = print,
    unscored: Mapping[str, str] | None = None,
) -> GenerateResult:
    """Sample ``samples`` completions per prompt from each model (one model in memory at a time).

    Args:
        models: ``[LABEL=]MODEL`` arguments as ``grpokit eval`` takes them (the embedded name, a
            model directory, a checkpoint, a run directory).
        rows: the prompts.
        samples: completions per prompt (K).
        sampling: temperature, top-p, top-k, max new tokens; the same for every model.
        seed: prompt chunk c is sampled with ``seed + c`` for every model.
        system_prompt, max_prompt_length: how prompts are rendered (as in training).
        reward_set: the config's rewards, or None for unscored samples.
        device: ``auto``, ``cpu``, ``cuda:0``, ...
        batch_size: completions generated at once.
        model_config: dtype and matmul settings (a config's ``model:`` section); default
            float32.
        config: the whole config, when there is one: its tools and environment (the models may
            call them; each sample then keeps its transcript) and its chat template variables.
        unscored: configured rewards left out of ``reward_set``, with why (shown with the
            results).
    """
    if not models:
        raise UserError("give at least one --model")
    if samples < 1:
        raise UserError("--samples must be at least 1")
    if not rows:
        raise UserError("there are no prompts to answer")
    if reward_set is not None:
        check_columns(rows, reward_set.required_columns, "the prompts")
    scoring = reward_set if reward_set is not None else RewardSet([], [])
    specs = unique_labels([resolve_model(m) for m in models])
    if config is not None:
        check_tools(config)  # a tool that does not import stops here, before any model loads
    out: list[Sample] = []
    for spec in specs:
        log(f"sampling {spec.label} ({spec.given}) ...")
        sampler = Sampler.load(
            model_config or ModelConfig(),
            scoring,
            sampling=sampling,
            system_prompt=system_prompt,
            max_prompt_length=max_prompt_length,
            base_dir=Path.cwd(),
            model=spec,
            device=resolve_device(device),
            chat_template_kwargs=config.training.chat_template_kwargs if config else None,
        )
        if config is not None:
            sampler.tools = tool_rollout(config, sampler.tokenizer)
        out += sampler.model_samples(
            spec.label, rows, samples, seed=seed, batch_size=batch_size, log=log
        )
        del sampler
    return GenerateResult(
        labels=[s.label for s in specs],
        paths={s.label: s.given for s in specs},
        prompts=[prompt_text(r.prompt) for r in rows],
        samples_per_prompt=samples,
        seed=seed,
        sampling=asdict(sampling),
        reward_names=list(reward_set.names) if reward_set is not None else [],
        samples=out,
        unscored=dict(unscored or {}),
    )


def run_generate(
    models: Sequence[str],
    prompts_file: Path | None,
    texts: Sequence[str],
    *,
    samples: int,
    config: Path | None = None,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    system_prompt: str | None = None,
    device: str | None = None,
    log: Callable[[str], None] = print,
) -> GenerateResult:
    """``grpokit generate``: the prompts answered by every model, scored by the config's rewards.

    With ``config``, its sampling settings, system prompt, prompt column, prompt length and model
    settings are used and its rewards score the samples; without one, plain sampling (128 new
    tokens). ``--prompt`` texts have no columns: a reward that reads one does not score them (nor
    do the rewards that depend on it), and the results say so. A prompt file must hold the
    columns its rewards read. ``overrides`` (SamplingParams fields; None: not given) and ``system_prompt`` and
    ``device`` (None: not given) take precedence over both.
    """
    from dataclasses import replace

    from grpokit.config import load_config
    from grpokit.rewards.compose import build_reward_set
    from grpokit.rewards.registry import BuildContext

    reward_set: RewardSet | None = None
    prompt_column, config_device = "prompt", "auto"
    max_prompt_length: int | None = None
    model_config: ModelConfig | None = None
    cfg: GRPOKitConfig | None = None
    defaults = SamplingParams(max_completion_length=128)
    if config is not None:
        cfg = load_config(config)
        defaults = cfg.training.sampling_params
        system_prompt = system_prompt if system_prompt is not None else cfg.system_prompt
        prompt_column, max_prompt_length = cfg.data.prompt_column, cfg.training.max_prompt_length
        config_device, model_config = cfg.model.device, cfg.model
        reward_set = build_reward_set(
            cfg.rewards, BuildContext(base_dir=cfg.config_dir, run_dir=None, seed=seed)
        )
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    try:
        try:
            sampling = replace(defaults, **given)
        except ValueError as exc:
            raise UserError(f"sampling settings: {exc}") from exc
        rows = prompt_rows(prompts_file, texts, prompt_column=prompt_column)
        unscored: dict[str, str] = {}
        if cfg is not None and reward_set is not None and prompts_file is None:
            # Rebuilt from the rewards that can score: each reward's columns are known once
            # built, and the set's gates must name rewards in it.
            kept, unscored = scorable(cfg.rewards, reward_set.columns_of, set())
            if unscored:
                reward_set.close()
                reward_set = None
                if kept:
                    reward_set = build_reward_set(
                        kept, BuildContext(base_dir=cfg.config_dir, run_dir=None, seed=seed)
                    )
            unscored = {n: f"{why}, which --prompt texts lack" for n, why in unscored.items()}
        return generate_samples(
            models,
            rows,
            samples=samples,
            sampling=sampling,
            seed=seed,
            system_prompt=system_prompt,
            max_prompt_length=max_prompt_length,
            reward_set=reward_set,
            device=device or config_device,
            model_config=model_config,
            config=cfg,
            log=log,
            unscored=unscored,
        )
    finally:
        if reward_set is not None:
            reward_set.close()


def _score_line(sample: Sample, names: Sequence[str]) -> str:
    parts = [f"{n} {_fmt(sample.rewards.get(n))}" for n in names]
    if names:
        parts.append(f"total {_fmt(sample.total)}")
    parts.append(f"{sample.length} tok{' (cut)' if sample.truncated else ''}")
    return " · ".join(parts)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render(result: GenerateResult, console: Any) -> None:
    """Print each prompt with the models' samples in columns, then the mean rewards per model.
    A sample with tools shows its whole transcript, tool calls and results marked."""
    from rich.markup import escape
    from rich.table import Table

    from grpokit.evaluate.transcripts import to_rich

    for i, prompt in enumerate(result.prompts):
        console.rule(f"[bold]prompt {i + 1}/{len(result.prompts)}")
        console.print(escape(prompt))
        table = Table(show_lines=True, expand=True)
        table.add_column("k", justify="right", width=3)
        for label in result.labels:
            table.add_column(escape(label), ratio=1, overflow="fold")
        per_model = [result.of(label, i) for label in result.labels]
        for k in range(result.samples_per_prompt):
            cells = []
            for mine in per_model:
                s = mine[k]
                shown = to_rich(s.transcript) if s.transcript else escape(s.text)
                cells.append(f"{shown}\n[dim]{_score_line(s, result.reward_names)}[/dim]")
            table.add_row(str(k + 1), *cells)
        console.print(table)
    if result.reward_names:
        summary = Table(title="mean reward over all samples", show_lines=False)
        summary.add_column("model")
        for name in [*result.reward_names, "total"]:
            summary.add_column(escape(name), justify="right")
        for label in result.labels:
            means = result.reward_means(label)
            summary.add_row(escape(label), *(_fmt(v) for v in means.values()))
        console.print(summary)
    for name, why in result.unscored.items():
        console.print(f"not scored: reward {escape(repr(name))} {escape(why)}")


def write_jsonl(result: GenerateResult, path: Path) -> Path:
    """Every sample as one JSON line (model, prompt, k, text, rewards); written atomically."""
    return write_records(
        path,
        (
            {"prompt": result.prompts[s.prompt_index], **_without_empty(asdict(s))}
            for s in result.samples
        ),
    )


def _without_empty(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` without a transcript or parts it does not have (a transcript only where tools
    were used, parts only where a reward reports them, as a checklist's items)."""
    return {k: v for k, v in record.items() if k not in ("transcript", "parts") or v}
