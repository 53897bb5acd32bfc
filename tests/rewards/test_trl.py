"""grpokit rewards inside TRL's GRPOTrainer, unchanged: one real training step on a tiny model."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from grpokit.rewards import math_answer, xml_format
from grpokit.rewards.builtin.format import XmlFormat, XmlFormatParams

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)
WORDS = ["<thinking>", "</thinking>", "<answer>", "</answer>", "4", "5", "add", "two", "plus", "?"]


def make_tiny_model(path: Path) -> None:
    """A random 2-layer Llama and a word-level tokenizer with a chat template, saved to ``path``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<unk>", "<user>", "<assistant>", "<system>"]
    vocab = {token: i for i, token in enumerate(specials + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    LlamaForCausalLM(config).save_pretrained(path)


class RecordingXmlFormat(XmlFormat):
    """The real xml_format reward, keeping the keyword arguments TRL called it with."""

    def __init__(self) -> None:
        super().__init__(XmlFormatParams(tags=["thinking", "answer"]))
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self, prompts: Any = None, completions: Any = None, **columns: Any
    ) -> list[float | None]:
        self.calls.append({"prompts": prompts, "completions": completions, **columns})
        return super().__call__(prompts=prompts, completions=completions, **columns)


def test_grpokit_rewards_in_trl_grpo_trainer(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model_dir = tmp_path / "tiny"
    make_tiny_model(model_dir)
    fmt = RecordingXmlFormat()
    correct = math_answer("answer")
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": "two plus two ?"}], "answer": "4"}] * 4
    )
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        logging_steps=1,
        learning_rate=1e-3,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        seed=0,
    )
    trainer = GRPOTrainer(
        model=str(model_dir), reward_funcs=[fmt, correct], args=args, train_dataset=dataset
    )
    trainer.train()

    assert len(fmt.calls) >= 1
    call = fmt.calls[0]
    assert len(call["completions"]) == 4
    # TRL's conversational completions: lists of assistant messages.
    assert call["completions"][0][0]["role"] == "assistant"
    assert call["prompts"][0][-1]["content"] == "two plus two ?"
    assert call["answer"] == ["4"] * 4
    assert "completion_ids" in call
    logged = {key for entry in trainer.state.log_history for key in entry}
    assert "rewards/xml_format/mean" in logged
    assert "rewards/math_answer/mean" in logged


def test_rewards_pickle() -> None:
    # TRL and multiprocessing data loaders may pickle reward functions.
    reward = pickle.loads(pickle.dumps(xml_format(tags=["a"])))
    assert reward(prompts=None, completions=["<a>x</a>"]) == [1.0]
