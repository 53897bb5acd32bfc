"""GRPO with tools end to end on the tiny model: tool tokens stay in the context and out of the
loss, tool metrics and transcripts are logged, the policy learns to prefer the rewarded
trajectory; bad tool settings stop the run before any model loads. The model's replies are
scripted (its sampling is not what is tested); the loop, tools, loss and update are real."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from grpokit.config import GRPOKitConfig, load_config, load_prompt_rows
from grpokit.core.losses import LossInputs, LossOutput
from grpokit.errors import UserError
from grpokit.train.forward import completion_logprobs, pack
from grpokit.train.trainer import GRPOTrainer
from tests.rollout.tool_helpers import TOOLS_MODULE, ScriptedEngine, hermes_call

REWARD = '''
def right_answer(prompts, completions, **columns):
    """1 for a completion that asked the calculator and answered 42."""
    return [1.0 if "<tool_response>42" in c and c.endswith("It is 42.") else 0.0 for c in completions]
'''
CALL = hermes_call("calculator", a=6, b=7)
FIRST = [CALL, CALL, "It is 41.", "I do not know."]


def reply(context: str, j: int) -> str:
    return (
        "It is 42."
        if context.rstrip().endswith("assistant") and "<|im_start|>tool" in context
        else FIRST[j]
    )


def scripted_engines(monkeypatch: pytest.MonkeyPatch, script: Any) -> list[ScriptedEngine]:
    """Make the trainer sample with a :class:`ScriptedEngine` replying by ``script``; the
    engines made, for their records."""
    engines: list[ScriptedEngine] = []

    def build(cfg: GRPOKitConfig, policy: Any, *, sharded: bool) -> ScriptedEngine:
        engines.append(ScriptedEngine(policy.model, policy.tokenizer, script))
        return engines[-1]

    monkeypatch.setattr("grpokit.train.trainer.build_engine", build)
    return engines


def write_config(tmp_path: Path, model_dir: Path, *, template: bool = True, **top: Any) -> Path:
    (tmp_path / "my_tools.py").write_text(TOOLS_MODULE)
    (tmp_path / "my_rewards.py").write_text(REWARD)
    prompts = [{"prompt": f"What is 6 times 7? ({i})"} for i in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    doc: dict[str, Any] = {
        "model": {"name_or_path": str(model_dir)}
        | ({"chat_template": "hermes"} if template else {}),
        "data": {"train": "train.jsonl"},
        "rewards": [{"type": "python", "name": "right", "function": "my_rewards.py:right_answer"}],
        "tools": ["my_tools.py:calculator", "my_tools.py:broken"],
        "training": {
            "learning_rate": 1e-2,
            "num_generations": 4,
            "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 1,
            "max_completion_length": 64,
            "max_tool_calling_iterations": 2,
            "max_steps": 3,
            "seed": 0,
            "report_to": ["none"],
            "output_dir": "run",
            "log_completions_steps": 1,
        },
    }
    for key, value in top.items():
        section, _, name = key.partition("__")
        if name:
            doc[section][name] = value
        else:
            doc[section] = value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


class RecordingLoss:
    """The trainer's loss, called through, with each micro-batch's mask kept."""

    def __init__(self, loss: Any) -> None:
        self.loss = loss
        self.masks: list[torch.Tensor] = []

    def __call__(self, inputs: LossInputs) -> LossOutput:
        self.masks.append(inputs.mask.detach().clone())
        out: LossOutput = self.loss(inputs)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loss, name)


def _sequence_logp(
    trainer: GRPOTrainer, prompt: list[int], ids: list[int], mask: list[int]
) -> float:
    """The log-probability of the model's own tokens of a completion (tool tokens left out)."""
    with torch.no_grad():
        logp, _ = completion_logprobs(
            trainer.policy.model, pack([prompt], [ids], trainer.pad_token_id)
        )
    return float((logp[0, : len(ids)] * torch.tensor(mask, dtype=torch.float32)).sum())


def test_grpo_with_tools_masks_tool_tokens_logs_and_learns(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted_engines(monkeypatch, reply)
    trainer = GRPOTrainer(
        load_config(write_config(tmp_path, tiny_model_dir)), progress=False, log=lambda m: None
    )
    recording = RecordingLoss(trainer.loss)
    trainer.loss = recording  # type: ignore[assignment]
    tokenizer = trainer.policy.tokenizer
    first = trainer.sampler.sample(trainer.rows[:1], 4, generator=torch.Generator().manual_seed(0))
    rollout = first.rollout
    prompt = first.prompt_ids[0]
    assert rollout.tool_mask is not None
    good, bad = rollout.completion_ids[0], rollout.completion_ids[3]
    masks = rollout.tool_mask[0], rollout.tool_mask[3]
    before = [
        _sequence_logp(trainer, prompt, ids, m) for ids, m in zip((good, bad), masks, strict=True)
    ]

    result = trainer.train()

    # The loss saw exactly the model's tokens: each row's mask is its tool mask.
    mask = recording.masks[0]
    for b in range(4):
        expected = torch.tensor(rollout.tool_mask[b], dtype=torch.float32)
        torch.testing.assert_close(mask[b, : len(expected)], expected)
        assert torch.all(mask[b, len(expected) :] == 0)
    assert mask[0].sum() < len(good)  # the tool message's tokens are out

    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 3
    for m in lines:
        assert m["tools/call_frequency"] == 0.5 and m["tools/failure_frequency"] == 0.0
        assert m["tools/calculator/calls"] == 2.0 and m["tools/broken/calls"] == 0.0
        assert m["turns/mean"] == 1.5 and m["turns/max"] == 2.0
        # TRL's completion length with tools: the model's own tokens.
        model_tokens = sum(sum(mask) for mask in rollout.tool_mask) / 4
        assert m["completions/mean_length"] == pytest.approx(model_tokens)
        assert m["reward"] == 0.5 and torch.isfinite(torch.tensor(m["loss"]))
    records = [
        json.loads(x) for x in (result.run_dir / "completions.jsonl").read_text().splitlines()
    ]
    called = next(r for r in records if len(r["transcript"]) == 3)
    assert [m["role"] for m in called["transcript"]] == ["assistant", "tool", "assistant"]
    assert called["transcript"][0]["tool_calls"] == [
        {"name": "calculator", "arguments": {"a": 6, "b": 7}}
    ]
    assert called["transcript"][1] == {
        "role": "tool",
        "name": "calculator",
        "content": "42",
        "error": False,
    }
    assert called["transcript"][2]["content"] == "It is 42."

    # Trained: the rewarded trajectory (with its tool call) gained probability, and far more
    # than the unrewarded one (whose shared tokens, such as the end of turn, gain too).
    after = [
        _sequence_logp(trainer, prompt, ids, m) for ids, m in zip((good, bad), masks, strict=True)
    ]
    assert after[0] > before[0] + 10.0
    assert after[0] - after[1] > before[0] - before[1] + 10.0
    assert tokenizer.decode(good).count("<tool_response>") == 1


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"template": False}, "does not show `tools` to the model"),
        ({"tools": ["my_tools.py:nothing"]}, r"tools\[0\]: tool 'my_tools.py:nothing'.*has no"),
        ({"tools": ["missing.py:f"]}, r"tools\[0\]: tool 'missing.py:f': file .* does not exist"),
        ({"tools": ["calculator"]}, r"tools\[0\] 'calculator' is not of the form"),
        ({"training__max_tool_calling_iterations": 0}, "max_tool_calling_iterations"),
        ({"training__tool_call_format": "regex"}, "tool_call_format: regex needs tool_call_regex"),
    ],
    ids=[
        "template-without-tools",
        "no-such-function",
        "no-file",
        "not-a-path",
        "iterations-0",
        "regex",
    ],
)
def test_bad_tool_settings_stop_before_any_model_loads(
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    changes: dict[str, Any],
    message: str,
) -> None:
    def no_model(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model was loaded before the tools were checked")

    monkeypatch.setattr("grpokit.train.trainer.build_policy", no_model)
    template = changes.pop("template", True)
    with pytest.raises(UserError, match=message):
        cfg = load_config(write_config(tmp_path, tiny_model_dir, template=template, **changes))
        GRPOTrainer(cfg, progress=False, log=lambda m: None)


def test_rewards_get_the_transcript_for_chat_prompts_and_the_text_for_strings() -> None:
    from grpokit.data.prompts import PromptRow
    from grpokit.sampling import reward_inputs

    rows = [
        PromptRow(prompt=[{"role": "user", "content": "6*7?"}], columns={}),
        PromptRow("6*7?", {}),
    ]
    messages = [
        [
            {"role": "assistant", "content": CALL},
            {"role": "tool", "name": "calculator", "content": "42"},
        ],
        [{"role": "assistant", "content": "42"}],
    ]
    texts = ["a", "b"]
    _, completions, columns = reward_inputs(rows, texts, [[1], [2]], 1, messages)
    assert completions == [messages[0], "b"]
    assert columns["completion_ids"] == [[1], [2]]


def test_resume_in_the_middle_of_a_run_with_tools(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from grpokit.train.run import resume_run

    scripted_engines(monkeypatch, reply)

    def config(output_dir: str) -> GRPOKitConfig:
        path = write_config(tmp_path, tiny_model_dir)
        cfg = load_config(path)
        cfg.training.max_steps, cfg.training.output_dir, cfg.training.save_steps = 3, output_dir, 1
        return cfg

    full = GRPOTrainer(config("full"), progress=False, log=lambda m: None).train()
    first = GRPOTrainer(config("split"), progress=False, log=lambda m: None)
    first.total_steps = 1  # stopped after the step-1 checkpoint
    first.train()
    resumed = resume_run(tmp_path / "split", progress=False)
    assert resumed.global_step == 3
    a = [json.loads(x) for x in (full.run_dir / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (resumed.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in b] == [1, 2, 3]
    for x, y in zip(a, b, strict=True):
        for key in ("reward", "loss", "grad_norm", "tools/call_frequency", "turns/mean"):
            assert x[key] == pytest.approx(y[key], rel=1e-5, abs=1e-7), (x["step"], key)


ENV_MODULE = '''
class Counter:
    """Reach a target by adding numbers (TRL's environment contract)."""

    made = 0

    def __init__(self):
        Counter.made += 1
        self.seat = Counter.made
        self.target = self.total = self.calls = 0

    def reset(self, prompt, target, **columns):
        self.target, self.total, self.calls = int(target), 0, 0
        return f" Target: {target}."

    def add(self, x: int) -> int:
        """Add a number to the running total.

        Args:
            x: the number to add
        """
        self.total += x
        self.calls += 1
        return self.total

    def get_reward(self) -> float:
        return 1.0 if self.total == self.target else 0.0


class Seated(Counter):
    """Each instance shows its own seat: the prompts of a group differ."""

    def reset(self, prompt, target, **columns):
        return super().reset(prompt, target) + f" Seat {self.seat}."


class NoReset:
    def add(self, x: int) -> int:
        """Add.

        Args:
            x: the number
        """
        return x


class BadReset(Counter):
    def reset(self, prompt, **columns):
        raise KeyError("target")


def calls_made(prompts, completions, environments, **columns):
    return [float(e.calls) for e in environments]
'''


def env_reply(context: str, j: int) -> str:
    if context.rstrip().endswith("assistant") and "<|im_start|>tool" in context:
        return "Done."
    target = int(context.split("Target: ")[1].split(".")[0])
    return [hermes_call("add", x=target), hermes_call("add", x=1), "No.", "No."][j]


def env_config(tmp_path: Path, model_dir: Path, factory: str) -> Path:
    (tmp_path / "my_env.py").write_text(ENV_MODULE)
    path = write_config(
        tmp_path,
        model_dir,
        environment_factory=f"my_env.py:{factory}",
        tools=[],
        rewards=[
            {"type": "environment", "max_value": 1.0},
            {"type": "python", "name": "calls", "function": "my_env.py:calls_made", "weight": 0.0},
        ],
    )
    prompts = [{"prompt": "Reach the target.", "target": t} for t in (7, 9, 11, 13)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return path


def test_environment_per_rollout_tools_reset_and_reward(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted_engines(monkeypatch, env_reply)
    cfg = load_config(env_config(tmp_path, tiny_model_dir, "Counter"))
    trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    tools = trainer.sampler.tools
    assert tools is not None and tools.environments is not None and tools.names == ["add"]
    tokenizer = trainer.policy.tokenizer
    scored = trainer.sampler.sample(trainer.rows[:1], 4, generator=torch.Generator().manual_seed(0))
    target = trainer.rows[0].columns["target"]
    assert tokenizer.decode(scored.prompt_ids[0]).count(f"Reach the target. Target: {target}.") == 1
    assert scored.row_prompt_ids is None  # the same reset for the whole group: one prompt
    envs = tools.environments.pool[:4]
    assert len({id(e) for e in envs}) == 4  # one instance per rollout
    assert [e.total for e in envs] == [target, 1, 0, 0]  # each call changed its own instance
    assert scored.scores.per_function[:, 0].tolist() == [1.0, 0.0, 0.0, 0.0]  # get_reward
    assert scored.scores.per_function[:, 1].tolist() == [1.0, 1.0, 0.0, 0.0]  # environments=
    assert scored.messages is not None and scored.messages[0][1]["content"] == str(target)
    made = type(envs[0]).made
    result = trainer.train()
    assert type(envs[0]).made == made  # construct once, reset often
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["rewards/environment/mean"] for m in lines] == [0.25] * 3
    assert all(m["tools/add/calls"] == 2.0 for m in lines)


def test_environment_resets_that_differ_give_each_rollout_its_prompt(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engines = scripted_engines(monkeypatch, env_reply)
    cfg = load_config(env_config(tmp_path, tiny_model_dir, "Seated"))
    cfg.training.max_steps = 1
    trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    scored = trainer.sampler.sample(trainer.rows[:1], 4, generator=torch.Generator().manual_seed(0))
    assert scored.row_prompt_ids is not None and len({tuple(p) for p in scored.row_prompt_ids}) == 4
    assert scored.expanded_prompt_ids() == scored.row_prompt_ids
    contexts, n, _ = engines[0].calls[0]
    assert n == 1 and contexts == scored.row_prompt_ids  # each rollout sampled from its own
    # One completion per prompt: the script's first reply (the right call) for every rollout.
    assert scored.scores.per_function[:, 0].tolist() == [1.0, 1.0, 1.0, 1.0]
    trainer.train()


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("NoReset", "needs a reset"),
        ("BadReset", r"reset\(\*\*row\) failed on the first training row with KeyError"),
        ("Missing", "has no 'Missing'"),
    ],
)
def test_bad_environments_stop_before_any_model_loads(
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    factory: str,
    message: str,
) -> None:
    def no_model(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model was loaded before the environment was checked")

    monkeypatch.setattr("grpokit.train.trainer.build_policy", no_model)
    cfg = load_config(env_config(tmp_path, tiny_model_dir, factory))
    with pytest.raises(UserError, match=rf"environment_factory.*{message}"):
        GRPOTrainer(cfg, progress=False, log=lambda m: None)


def test_eval_and_generate_sample_with_the_configs_tools(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Sampler.from_config (grpokit eval, generate, preflight) takes the tools too."""
    from grpokit.rewards import BuildContext, build_reward_set
    from grpokit.sampling import Sampler

    cfg = load_config(write_config(tmp_path, tiny_model_dir))
    rewards = build_reward_set(cfg.rewards, BuildContext(base_dir=cfg.config_dir))
    sampler = Sampler.from_config(cfg, rewards)
    assert sampler.tools is not None and sampler.tools.names == ["calculator", "broken"]
    sampler.engine = ScriptedEngine(sampler.policy.model, sampler.tokenizer, reply)
    scored = sampler.score_prompts(load_prompt_rows(cfg, "train")[:1], 4, seed=0)
    assert [s.rewards["right"] for s in scored.samples("m")] == [1.0, 1.0, 0.0, 0.0]
    assert "<tool_response>42</tool_response>" in scored.samples("m")[0].text.replace("\n", "")
    transcript = scored.samples("m")[0].transcript  # what eval and generate write
    assert transcript is not None and [m["role"] for m in transcript] == [
        "assistant",
        "tool",
        "assistant",
    ]
    rewards.close()


def test_the_context_check_counts_the_tools_schemas(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The chat template writes the tools' schemas into every prompt: a prompt that fits the
    context alone but not with them is caught at start-up (refused, or dropped when asked)."""
    from transformers import AutoTokenizer

    from grpokit.data.chat import encode_prompt
    from grpokit.rollout.tools import load_tools
    from tests.rollout.tool_helpers import HERMES_TEMPLATE

    write_config(tmp_path, tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = HERMES_TEMPLATE
    schemas = [t.schema for t in load_tools(["my_tools.py:calculator"], tmp_path)]
    long = "word " * 300
    alone = len(encode_prompt(tokenizer, long))
    assert len(encode_prompt(tokenizer, long, tools=schemas)) > alone
    rows = [{"prompt": "What is 6 times 7?"}, {"prompt": long}]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    context = 2048  # the tiny model's max_position_embeddings
    logged: list[str] = []

    def start(**top: Any) -> GRPOTrainer:
        settings = {
            "training__max_completion_length": context - alone,  # the long prompt just fits
            "training__max_prompt_length": None,
        }
        cfg = load_config(write_config(tmp_path, tiny_model_dir, **(settings | top)))
        (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return GRPOTrainer(cfg, progress=False, log=logged.append)

    assert len(start(tools=[]).rows) == 2  # without tools it fits
    with pytest.raises(UserError, match=rf"data.train: 1 of 2 prompts are longer than the {alone}"):
        start()
    assert [r.prompt for r in start(data__drop_long_prompts=True).rows] == [rows[0]["prompt"]]
    # With max_prompt_length the prompt is cut instead, and said so: counted with the tools too.
    start(training__max_prompt_length=alone)
    assert any(m.startswith("1 of 2 data.train prompts are longer than") for m in logged)


def qwen_model_dir(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """The tiny model with Qwen2.5-Instruct's own chat template (which shows tools)."""
    import shutil

    from tests.rollout.tool_helpers import QWEN25_TEMPLATE

    out = tmp_path / "qwen-template-model"
    shutil.copytree(tiny_model_dir, out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "chat_template.jinja").write_text(QWEN25_TEMPLATE)
    return out


@pytest.mark.parametrize("setting", [None, "auto", "hermes"])
def test_the_models_own_tool_template_unless_one_is_forced(
    tmp_path: Path, tiny_model_dir: Path, setting: str | None
) -> None:
    """A model with a tool template of its own (Qwen2.5's) is prompted with it, calls read as
    its <tool_call> tags, without model.chat_template and with `auto`; `hermes` replaces it. On
    SmolLM2's template, which cannot show tools, `auto` gives grpokit's hermes."""
    from grpokit.data.chat import HERMES_TEMPLATE, encode_prompt
    from grpokit.sampling.sampler import load_model_policy, tool_rollout
    from tests.rollout.tool_helpers import QWEN25_TEMPLATE

    model = qwen_model_dir(tmp_path, tiny_model_dir)
    top = {} if setting is None else {"model__chat_template": setting}
    cfg = load_config(write_config(tmp_path, model, template=False, **top))
    tokenizer = load_model_policy(cfg.model, base_dir=cfg.config_dir).tokenizer
    rollout = tool_rollout(cfg, tokenizer)
    assert rollout is not None and rollout.format == "hermes"
    prompt = tokenizer.decode(encode_prompt(tokenizer, "What is 6 times 7?", tools=rollout.schemas))
    if setting == "hermes":
        assert tokenizer.chat_template == HERMES_TEMPLATE
    else:
        assert tokenizer.chat_template == QWEN25_TEMPLATE
        assert "You are provided with function signatures within <tools></tools>" in prompt
    smollm = load_config(write_config(tmp_path, tiny_model_dir, model__chat_template="auto"))
    tokenizer = load_model_policy(smollm.model, base_dir=smollm.config_dir).tokenizer
    assert tokenizer.chat_template == HERMES_TEMPLATE and tool_rollout(smollm, tokenizer)


BARE = json.dumps({"name": "calculator", "arguments": {"a": 6, "b": 7}})


def bare_reply(context: str, j: int) -> str:
    """Calls written as Qwen2.5-Coder wrote them: bare JSON, or in a json code block."""
    if context.rstrip().endswith("assistant") and "<|im_start|>tool" in context:
        return "It is 42."
    return [BARE, f"```json\n{BARE}\n```", "It is 41.", "I do not know."][j]


@pytest.mark.parametrize("lenient", [False, True], ids=["strict", "lenient"])
def test_calls_outside_the_format_are_logged_warned_about_or_run(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, lenient: bool
) -> None:
    scripted_engines(monkeypatch, bare_reply)
    cfg = load_config(
        write_config(
            tmp_path,
            tiny_model_dir,
            training__max_steps=2,
            training__tool_call_lenient=lenient,
        )
    )
    logged: list[str] = []
    result = GRPOTrainer(cfg, progress=False, log=logged.append).train()
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["tools/unparsed_frequency"] for m in lines] == [0.5, 0.5]
    warnings = [w for w in logged if "outside the tool-call format" in w]
    if lenient:  # run as calls (and rewarded), still counted; nothing to warn about
        assert [m["tools/call_frequency"] for m in lines] == [0.5, 0.5]
        assert [m["reward"] for m in lines] == [0.5, 0.5] and warnings == []
    else:  # not run, never rewarded: said once, with what to do
        assert [m["tools/call_frequency"] for m in lines] == [0.0, 0.0]
        assert [m["reward"] for m in lines] == [0.0, 0.0]
        assert len(warnings) == 1 and "training.tool_call_lenient: true" in warnings[0]
