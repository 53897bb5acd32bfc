"""`grpokit sft`: demonstrations and rejection sampling on the tiny model, checkpoints that
`train` starts from, and the user errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from grpokit.cli import main
from grpokit.config import GRPOKitConfig
from grpokit.data.chat import encode_prompt
from grpokit.errors import UserError
from grpokit.models.loading import load_policy
from grpokit.train.forward import completion_logprobs, pack
from grpokit.train.sft import Demonstration, load_demonstrations
from grpokit.train.sft_run import ROLLOUTS_FILE, Criterion, run_sft_from_config
from grpokit.train.trainer import GRPOTrainer

PARITY = '''
def even_length(prompts, completions, **columns):
    """1 for completions with an even number of characters: about half of random texts."""
    out = []
    for c in completions:
        text = c if isinstance(c, str) else c[0]["content"]
        out.append(1.0 if len(text) % 2 == 0 else 0.0)
    return out
'''

EVEN = [{"type": "python", "name": "even", "function": "parity.py:even_length", "max_value": 1.0}]


def _nll(model_dir: Path | None, base: Path, demos: list[Demonstration], system: str) -> float:
    """Mean negative log-likelihood per completion token (+ EOS) of demos under a checkpoint."""
    policy = load_policy(str(base), need_reference=False, init_from=model_dir)
    tok = policy.tokenizer
    prompts = [encode_prompt(tok, d.prompt, system_prompt=system) for d in demos]
    targets = [
        tok(d.completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for d in demos
    ]
    batch = pack(prompts, targets, tok.pad_token_id)
    policy.model.eval()
    with torch.no_grad():
        logp, _ = completion_logprobs(policy.model, batch)
    mask = batch.completion_mask
    return float(-(logp * mask).sum() / mask.sum())


def _demos(tmp_path: Path) -> Path:
    rows = [
        {"prompt": f"Say something about {w}.", "completion": f"<answer>{w} are fine</answer>"}
        for w in ["apples", "rivers", "stars", "trees"]
    ]
    path = tmp_path / "demos.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("mode", ["--full", "--lora"])
def test_sft_on_demonstrations_then_train_from_it(
    tmp_path: Path,
    tiny_model_dir: Path,
    make_config: Callable[..., GRPOKitConfig],
    mode: str,
) -> None:
    cfg = make_config(model={"lora": {"r": 4, "alpha": 8}} if mode == "--lora" else {})
    demos = _demos(tmp_path)
    out = tmp_path / "sft"
    result = CliRunner().invoke(
        main,
        [
            "sft",
            str(cfg.config_path),
            "--data",
            str(demos),
            mode,
            "--steps",
            "6",
            "--batch-size",
            "4",
            "--learning-rate",
            "1e-2" if mode == "--lora" else "3e-3",
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"checkpoint: {out}" in result.output
    marker = "adapter_config.json" if mode == "--lora" else "config.json"
    assert (out / marker).is_file()
    info = json.loads((out / "grpokit_policy.json").read_text())
    assert info["sft"]["steps"] == 6 and info["sft"]["pairs"] == 4
    # The demonstrations became more likely (loss on completion tokens only).
    pairs = load_demonstrations(demos)
    before = _nll(None, tiny_model_dir, pairs, "You are terse.")
    after = _nll(out, tiny_model_dir, pairs, "You are terse.")
    assert after < before - 0.5, (before, after)
    # `train` starts from it: model.init_from (also the KL reference).
    lora = {"lora": {"r": 4, "alpha": 8}} if mode == "--lora" else {}
    cfg2 = make_config(model={"init_from": str(out), **lora}, beta=0.04, max_steps=1)
    trainer = GRPOTrainer(cfg2, progress=False, log=lambda m: None)
    tok = trainer.policy.tokenizer
    ids = torch.tensor([tok("<answer>apples", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        with trainer.policy.reference_model() as ref:
            ref_logits = ref(input_ids=ids).logits
        pol_logits = trainer.policy.model(input_ids=ids).logits
    assert torch.allclose(ref_logits, pol_logits, atol=1e-5), "reference is not the SFT weights"
    assert trainer.train().global_step == 1


def test_from_rollouts_keeps_only_passing_and_fine_tunes_on_them(
    tmp_path: Path, tiny_model_dir: Path, make_config: Callable[..., GRPOKitConfig]
) -> None:
    (tmp_path / "parity.py").write_text(PARITY)
    cfg = make_config(rewards=EVEN, max_completion_length=6)
    out = tmp_path / "sft"
    result = run_sft_from_config(
        cfg,
        output=out,
        from_rollouts=True,
        prompts=4,
        generations=6,
        steps=6,
        batch_size=4,
        learning_rate=3e-3,
        lora=False,
        min_kept=2,
        log=lambda m: None,
    )
    sel = result.selection
    assert sel is not None and sel.sampled == 24
    # The kept set is exactly the distinct passing samples, recomputed from the scored batches.
    passing = {
        (json.dumps(b.rows[i // b.group_size].prompt), t)
        for b in sel.batches
        for i, t in enumerate(b.texts)
        if len(t) % 2 == 0 and t.strip()
    }
    failing = {t for b in sel.batches for t in b.texts if len(t) % 2}
    assert 0 < sel.passed < sel.sampled
    assert {(json.dumps(d.prompt), d.completion) for d in sel.demos} == passing
    assert not failing & {d.completion for d in sel.demos}
    # Written beside the checkpoint in the --data format, and all of it passes the reward.
    kept = load_demonstrations(out / ROLLOUTS_FILE)
    assert len(kept) == len(sel.demos) == result.demos
    assert all(len(d.completion) % 2 == 0 for d in kept)
    # Fine-tuned on them: the kept completions became more likely.
    before = _nll(None, tiny_model_dir, kept, "You are terse.")
    after = _nll(out, tiny_model_dir, kept, "You are terse.")
    assert after < before - 0.5, (before, after)


def test_from_rollouts_reward_threshold(
    tmp_path: Path, make_config: Callable[..., GRPOKitConfig]
) -> None:
    (tmp_path / "parity.py").write_text(PARITY)
    cfg = make_config(rewards=EVEN, max_completion_length=4)
    with pytest.raises(UserError, match=r"only 0 distinct samples pass \(0/8, even >= 2\)"):
        run_sft_from_config(
            cfg,
            output=tmp_path / "x",
            from_rollouts=True,
            prompts=2,
            generations=4,
            criterion=Criterion("even", 2.0),
            log=lambda m: None,
        )
    assert not (tmp_path / "x").exists()
    with pytest.raises(UserError, match="not a configured reward"):
        run_sft_from_config(
            cfg,
            output=tmp_path / "x",
            from_rollouts=True,
            prompts=2,
            generations=4,
            criterion=Criterion("nope"),
            log=lambda m: None,
        )


def test_cli_user_errors(tmp_path: Path, make_config: Callable[..., GRPOKitConfig]) -> None:
    cfg = make_config()
    runner = CliRunner()
    result = runner.invoke(main, ["sft", str(cfg.config_path)])
    assert result.exit_code == 2 and "exactly one of --data" in result.output
    demos = _demos(tmp_path)
    result = runner.invoke(
        main, ["sft", str(cfg.config_path), "--data", str(demos), "--from-rollouts"]
    )
    assert result.exit_code == 2 and "exactly one of --data" in result.output
    result = runner.invoke(main, ["sft", str(cfg.config_path), "--data", str(tmp_path / "no")])
    assert result.exit_code == 2 and "does not exist" in result.output
