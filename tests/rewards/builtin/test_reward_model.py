"""type: reward_model on a tiny random classifier: scores against direct forwards of the same
model, TRL's text rendering, batching, loading once, normalisation, truncation, errors, and a
real RewardSet built from YAML."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from grpokit.errors import UserError
from grpokit.rewards import BuildContext, RewardModelReward, RewardSpec, build_reward_set
from grpokit.rewards.builtin.reward_model import RewardModelParams, normalise_scores, render_text
from grpokit.rewards.registry import get_reward_type
from tests.rewards.results import evaluate

PROMPTS = [
    "What is 2+2?",
    "Name a colour.",
    "Say hi.",
    "Summarise the plot of a long novel about a whale and a captain who hunts it.",
    "What is 2+2?",
    "Count to five.",
    "Name a colour.",
]
COMPLETIONS = [
    "4",
    "Blue, obviously, the colour of the sea and of the sky on a clear day.",
    "hi",
    "A captain hunts a white whale; it ends badly for nearly everyone on board.",
    "It is 4, because two and two make four.",
    "one two three four five",
    "",
]


def direct_scores(model_dir: Path, texts: list[str]) -> torch.Tensor:
    """Each text scored alone by a freshly loaded copy of the model: logits[0, 0]."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    out = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            out.append(model(input_ids=ids).logits[0, 0])
    return torch.stack(out)


def make_reward(model_dir: Path, **params: Any) -> RewardModelReward:
    params.setdefault("device", "cpu")
    return RewardModelReward(RewardModelParams(model=str(model_dir), **params))


def chat(prompts: list[str]) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": p}] for p in prompts]


def test_plain_text_scores_equal_a_direct_forward(tiny_classifier_dir: Path) -> None:
    reward = make_reward(tiny_classifier_dir, batch_size=3)
    result = evaluate(reward, PROMPTS, COMPLETIONS)
    scores = result.values
    expected = direct_scores(
        tiny_classifier_dir, [p + c for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    )
    torch.testing.assert_close(torch.tensor(scores), expected)
    assert len(set(scores)) == len(scores)  # a random head still tells the texts apart
    assert result.metrics == {"reward_model/truncated_frac": 0.0}
    assert get_reward_type("reward_model").max_value is None  # unbounded


def test_chat_prompts_are_rendered_as_trl_renders_them(tiny_classifier_dir: Path) -> None:
    from transformers import AutoModelForSequenceClassification
    from trl.data_utils import apply_chat_template

    reward = make_reward(tiny_classifier_dir, batch_size=4)
    prompts = chat(PROMPTS)
    completions = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    # TRL's GRPOTrainer: apply_chat_template on prompt + completion messages, then one
    # right-padded batch without added special tokens, and logits[:, 0].
    tokenizer = reward.tokenizer
    texts = [
        apply_chat_template({"messages": p + c}, tokenizer)["text"]
        for p, c in zip(prompts, completions, strict=True)
    ]
    for prompt, completion, text in zip(prompts, completions, texts, strict=True):
        assert render_text(tokenizer, prompt, completion) == text
        assert text.endswith(f"<|im_start|>assistant\n{completion[0]['content']}<|im_end|>\n")
    inputs = tokenizer(
        text=texts,
        return_tensors="pt",
        padding=True,
        padding_side="right",
        add_special_tokens=False,
    )
    model = AutoModelForSequenceClassification.from_pretrained(tiny_classifier_dir)
    model.config.pad_token_id = tokenizer.pad_token_id
    with torch.no_grad():
        trl_scores = model(**inputs).logits[:, 0]
    scores = reward(prompts=prompts, completions=completions)
    torch.testing.assert_close(torch.tensor(scores), trl_scores)
    # A string completion after a chat prompt (as a `rewards check` file may have it) is the
    # assistant's message; and chat rendering differs from plain concatenation.
    assert reward(prompts=prompts, completions=COMPLETIONS) == scores
    assert reward(prompts=PROMPTS, completions=COMPLETIONS) != scores


def test_batch_size_does_not_change_scores(tiny_classifier_dir: Path) -> None:
    one = make_reward(tiny_classifier_dir, batch_size=1)
    four = make_reward(tiny_classifier_dir, batch_size=4)
    for prompts in (PROMPTS, chat(PROMPTS)):
        torch.testing.assert_close(
            torch.tensor(four(prompts=prompts, completions=COMPLETIONS)),
            torch.tensor(one(prompts=prompts, completions=COMPLETIONS)),
        )


def test_the_model_is_loaded_once_and_closed(tiny_classifier_dir: Path) -> None:
    reward = make_reward(tiny_classifier_dir)
    model = reward.model
    weight = next(model.parameters())
    first = reward(prompts=PROMPTS, completions=COMPLETIONS)
    second = reward(prompts=PROMPTS[:2], completions=COMPLETIONS[:2])
    # The same module and the same weight tensor: nothing was reloaded between calls.
    assert reward.model is model and next(reward.model.parameters()) is weight
    torch.testing.assert_close(torch.tensor(second), torch.tensor(first[:2]))
    assert not model.training and not weight.requires_grad
    reward.close()
    reward.close()  # twice is harmless
    assert reward.model is None
    with pytest.raises(RuntimeError, match="closed"):
        reward(prompts=PROMPTS, completions=COMPLETIONS)


def test_normalisation(tiny_classifier_dir: Path) -> None:
    raw = torch.tensor(make_reward(tiny_classifier_dir)(prompts=PROMPTS, completions=COMPLETIONS))
    reward = make_reward(tiny_classifier_dir, normalize="batch", scale=2.0, shift=0.5)
    result = evaluate(reward, PROMPTS, COMPLETIONS)
    scores = torch.tensor(result.values, dtype=torch.float64)
    raw64 = raw.double()
    z = (raw64 - raw64.mean()) / raw64.std(unbiased=False)
    torch.testing.assert_close(scores, 2.0 * z + 0.5)
    assert scores.mean().item() == pytest.approx(0.5)
    assert scores.std(unbiased=False).item() == pytest.approx(2.0)
    metrics = result.metrics
    assert metrics["reward_model/raw_mean"] == pytest.approx(raw.mean().item())
    assert metrics["reward_model/raw_std"] == pytest.approx(raw.std(unbiased=False).item())
    # Fixed scale and shift alone: an affine map of the raw score.
    fixed = make_reward(tiny_classifier_dir, scale=10.0, shift=-1.0)
    torch.testing.assert_close(
        torch.tensor(fixed(prompts=PROMPTS, completions=COMPLETIONS)), 10.0 * raw - 1.0
    )
    # A batch without spread has nothing to normalise: zeros, then the shift.
    same = reward(prompts=[PROMPTS[0]] * 3, completions=[COMPLETIONS[0]] * 3)
    assert same == [0.5, 0.5, 0.5]
    assert normalise_scores(torch.tensor([3.0]), "batch").tolist() == [0.0]
    with pytest.raises(ValueError, match="scale"):
        RewardModelParams(model="m", scale=-1.0)


def test_long_texts_keep_their_end(tiny_classifier_dir: Path) -> None:
    reward = make_reward(tiny_classifier_dir, max_length=6, batch_size=2)
    result = evaluate(reward, PROMPTS, COMPLETIONS)
    scores = result.values
    tokenizer = reward.tokenizer
    texts = [p + c for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    kept = [tokenizer.decode(ids[-6:]) for ids in encoded]
    torch.testing.assert_close(torch.tensor(scores), direct_scores(tiny_classifier_dir, kept))
    longer = sum(len(ids) > 6 for ids in encoded)
    assert 0 < longer < len(texts)
    assert result.metrics["reward_model/truncated_frac"] == pytest.approx(longer / len(texts))
    # Without max_length the model's own limit applies (2048 positions for the tiny model).
    assert make_reward(tiny_classifier_dir).max_length == 2048


def spec_list(text: str) -> list[RewardSpec]:
    return [RewardSpec.model_validate(entry) for entry in yaml.safe_load(text)]


def test_a_reward_set_from_yaml(tiny_classifier_dir: Path, tmp_path: Path) -> None:
    shutil.copytree(tiny_classifier_dir, tmp_path / "rm")
    specs = spec_list(
        textwrap.dedent(
            """
            - type: xml_format
              tags: [answer]
            - type: reward_model
              name: preference
              model: rm            # relative to the config's directory
              batch_size: 2
              weight: 0.5
              gate: {reward: xml_format, min: 1.0, otherwise: null}
            """
        )
    )
    completions = ["<answer>4</answer>", "four", "<answer>Blue</answer>"]
    prompts = ["What is 2+2?", "What is 2+2?", "Name a colour."]
    with build_reward_set(specs, BuildContext(base_dir=tmp_path)) as reward_set:
        scores = reward_set(prompts, completions, {})
        again = reward_set(prompts, completions, {})
    expected = direct_scores(
        tiny_classifier_dir, [prompts[0] + completions[0], prompts[2] + completions[2]]
    )
    preference = scores.column("preference")
    assert preference[1] is None  # gated out: the format failed, never sent to the model
    torch.testing.assert_close(torch.tensor([preference[0], preference[2]]), expected)
    totals = scores.total.tolist()
    assert totals[0] == pytest.approx(1.0 + 0.5 * preference[0], abs=1e-6)
    assert totals[1] == pytest.approx(0.0)
    assert scores.metrics["reward_model/truncated_frac"] == 0.0
    assert again.column("preference") == preference
    assert reward_set.max_values == [1.0, None]


def test_bad_settings_are_user_errors_naming_the_field(
    tiny_classifier_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    ctx = BuildContext(base_dir=tmp_path)
    with pytest.raises(UserError, match=r"reward_model\.model: .*missing_rm does not exist"):
        build_reward_set(spec_list("- {type: reward_model, model: missing_rm}"), ctx)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(UserError, match=r"reward_model\.model: .*no config\.json"):
        build_reward_set(spec_list("- {type: reward_model, model: empty_dir}"), ctx)
    # A causal language model has no trained score head: its scores would be random.
    with pytest.raises(UserError, match=r"reward_model\.model: .*no trained classification head"):
        build_reward_set(spec_list(f"- {{type: reward_model, model: '{tiny_model_dir}'}}"), ctx)
    with pytest.raises(UserError, match=r"reward_model\.label_index: 1 is out of range"):
        make_reward(tiny_classifier_dir, label_index=1)
    with pytest.raises(ValueError, match="unknown parameter 'normalise'"):
        spec_list("- {type: reward_model, model: rm, normalise: batch}")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match=r"reward_model\.device: cuda:0 is not available"):
            make_reward(tiny_classifier_dir, device="cuda:0")
