"""Labels from `grpokit review`, exported with --export-rm, train a reward model with TRL's
RewardTrainer, and the result is a `type: reward_model` reward: the export is in the form that
training path reads."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from grpokit.cli import main
from grpokit.evaluate.review_data import LabelStore, find_samples, items_from_scores
from grpokit.rewards.builtin.reward_model import RewardModelParams, RewardModelReward

SAMPLES = [
    ("Name a fruit.", "An apple, crisp and sweet.", 1),
    ("Name a fruit.", "fruit fruit fruit", 0),
    ("Say hi politely.", "Hello, pleased to meet you.", 1),
    ("Say hi politely.", "what", 0),
]


def test_exported_pairs_train_a_reward_model_that_grpokit_loads(
    tmp_path: Path, tiny_classifier_dir: Path
) -> None:
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    source = tmp_path / "eval"
    source.mkdir()
    rows = [
        {"model": "m", "prompt": p, "completion": c, "reward": None, "rewards": {},
         "parts": {"checklist/good": float(good)}}
        for p, c, good in SAMPLES
    ]  # fmt: skip
    (source / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (source / "eval.json").write_text("{}")
    found = find_samples(source)
    store = LabelStore.open(found, items_from_scores(found.samples), seed=0)
    for sample, (_, _, good) in zip(found.samples, SAMPLES, strict=True):
        store.save(sample.id, "ann", {"good": good}, None, "")

    out = tmp_path / "rm.jsonl"
    res = CliRunner().invoke(main, ["review", str(source), "--export-rm", str(out)])
    assert res.exit_code == 0, res.output
    data = Dataset.from_json(str(out))
    assert data.column_names == ["prompt", "chosen", "rejected", "margin"] and len(data) == 2

    tokenizer = AutoTokenizer.from_pretrained(tiny_classifier_dir)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_classifier_dir)
    args = RewardConfig(
        output_dir=str(tmp_path / "rm-run"), max_steps=12, per_device_train_batch_size=2,
        learning_rate=3e-3, report_to="none", save_strategy="no", logging_steps=1,
        use_cpu=True, seed=0,
    )  # fmt: skip
    trainer = RewardTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert losses[-1] < losses[0]
    trainer.save_model(str(tmp_path / "rm"))
    tokenizer.save_pretrained(str(tmp_path / "rm"))

    reward = RewardModelReward(RewardModelParams(model=str(tmp_path / "rm"), device="cpu"))
    prompts = [[{"role": "user", "content": p}] for p, _, _ in SAMPLES]
    completions = [[{"role": "assistant", "content": c}] for _, c, _ in SAMPLES]
    scores = reward(prompts=prompts, completions=completions)
    # The person's preferences, learned: each prompt's good answer above its bad one.
    assert scores[0] > scores[1] and scores[2] > scores[3], scores
