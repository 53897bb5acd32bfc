"""The multi-turn tool loop over a real vLLM engine (a CUDA GPU, or vLLM's CPU build: ``bash
scripts/setup.sh vllm`` then ``make test-vllm``): token ids in, the sampled ids and their
log-probs out, turn by turn. Only vLLM's choice of token is scripted (:class:`ForcedSampler`
replaces its sampler's draw, as ``ForcedTokens`` does the torch engine's); vLLM's prefill of the
concatenated contexts, its log-probs, its stop handling, and the loop, the tools and the masks
are real."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpokit.data.chat import encode_prompt
from grpokit.rollout.agent import ToolMessageTokens, ToolRollout
from grpokit.rollout.base import RolloutBatch, RolloutEngine, SamplingParams
from grpokit.rollout.tool_calls import parse_hermes
from grpokit.rollout.tools import ToolRunner, load_tools
from grpokit.rollout.vllm_engine import VLLMEngine, vllm_available, vllm_platform
from grpokit.train.step_metrics import tool_metrics

from .tool_helpers import HERMES_TEMPLATE, TOOLS_MODULE, hermes_call, teacher_forced_logprobs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not vllm_available(),
        reason="needs vLLM (a CUDA GPU with grpokit[vllm], or vLLM's CPU build: make test-vllm)",
    ),
]
AGREE = 1e-3  # float32 vLLM against float32 torch (as in test_vllm_engine.py)
CHATML_TOOL = "\n<|im_start|>tool\n<tool_response>{}</tool_response><|im_end|>"
CHATML_NEXT = "\n<|im_start|>assistant\n"
Script = Callable[[int], list[int]]
"""A row's index in vLLM's batch -> the tokens it takes (then EOS)."""


class ForcedSampler:
    """Stands in for the draw of vLLM's sampler (``vllm.v1.sample.sampler.Sampler.sample``): at
    step s of a ``generate`` call the row at batch index i takes ``script(i)[s]``, then EOS; its
    log-prob is read from ``log_softmax(logits / T)``, what vLLM reports as processed log-probs.
    Each ``generate`` of a wrapped engine starts the next script and records its inputs."""

    def __init__(self, scripts: list[Script], eos: int) -> None:
        self.scripts = list(scripts)
        self.eos = eos
        self.current: Script = lambda i: []
        self.step = 0
        self.calls: list[tuple[list[list[int]], int, int]] = []

    def wrap(self, engine: VLLMEngine) -> Any:
        forced = self

        class Scripted(RolloutEngine):
            def generate(
                self, prompt_ids: list[list[int]], n: int, params: SamplingParams, **kw: Any
            ) -> RolloutBatch:
                forced.current, forced.step = forced.scripts.pop(0), 0
                forced.calls.append(
                    ([list(p) for p in prompt_ids], n, params.max_completion_length)
                )
                return engine.generate(prompt_ids, n, params, **kw)

            def sync_weights(self) -> None:
                engine.sync_weights()

        return Scripted()

    def sample(
        self, sampler: Any, logits: torch.Tensor, metadata: Any, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = logits.shape[0]
        picks = [self.current(i) for i in range(rows)]
        tokens = torch.tensor(
            [p[self.step] if self.step < len(p) else self.eos for p in picks],
            dtype=torch.long,
            device=logits.device,
        )
        self.step += 1
        temperature = metadata.temperature
        scaled = logits.float() if temperature is None else logits.float() / temperature[:, None]
        return tokens, torch.log_softmax(scaled, dim=-1)


@pytest.fixture(scope="module")
def vllm_setup(
    vllm_tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[VLLMEngine, Any, Any, list[Any]]]:
    """One engine for the module (building one takes most of a test's time on CPU)."""
    path = vllm_tiny_model_dir
    device = torch.device("cuda" if vllm_platform() == "cuda" else "cpu")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = HERMES_TEMPLATE
    engine = VLLMEngine(
        model,
        model_path=str(path),
        eos_token_ids=[int(tokenizer.eos_token_id)],
        gpu_memory_utilization=0.2,
        max_model_len=1024,
        max_num_seqs=8,
        dtype=torch.float32,
    )
    tools_dir = tmp_path_factory.mktemp("tools")
    (tools_dir / "my_tools.py").write_text(TOOLS_MODULE)
    tools = load_tools(["my_tools.py:calculator"], tools_dir)
    yield engine, model.cpu(), tokenizer, tools


def _forced(monkeypatch: pytest.MonkeyPatch, scripts: list[Script], eos: int) -> ForcedSampler:
    from vllm.v1.sample.sampler import Sampler

    forced = ForcedSampler(scripts, eos)

    def sample(sampler: Any, logits: torch.Tensor, metadata: Any, *a: Any, **k: Any) -> Any:
        return forced.sample(sampler, logits, metadata, *a, **k)

    monkeypatch.setattr(Sampler, "sample", sample)
    return forced


def _ids(tokenizer: Any, text: str) -> list[int]:
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


def _rollout(tokenizer: Any, tools: list[Any]) -> ToolRollout:
    return ToolRollout(
        ToolRunner(tools, timeout=5.0, max_result_chars=2000),
        parse_hermes,
        ToolMessageTokens(tokenizer, [t.schema for t in tools]),
    )


def test_scripted_tool_calls_on_vllm_only_calling_rows_go_on(
    vllm_setup: tuple[VLLMEngine, Any, Any, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, model, tokenizer, tools = vllm_setup
    eos = int(tokenizer.eos_token_id)
    call = _ids(tokenizer, hermes_call("calculator", a=3, b=4))
    answer = _ids(tokenizer, "12")
    # Turn 1: the first row of vLLM's batch calls the tool, the others answer at once; turn 2:
    # every row sampled again answers.
    forced = _forced(monkeypatch, [lambda i: call if i == 0 else answer, lambda i: answer], eos)
    rollout = _rollout(tokenizer, tools)
    prompts = [
        encode_prompt(tokenizer, q, tools=rollout.schemas) for q in ["3 times 4?", "Product?"]
    ]
    out = rollout.generate(
        forced.wrap(engine), prompts, 2, SamplingParams(max_completion_length=100)
    )
    suffix = _ids(tokenizer, CHATML_TOOL.format("12") + CHATML_NEXT)
    called = [b for b in range(4) if out.completion_ids[b][: len(call)] == call]
    assert len(called) == 1, out.completion_ids  # one row of the batch called
    assert forced.calls[0][1:] == (2, 100)  # turn 1: the groups, as without tools
    (contexts, n, budget) = forced.calls[1]
    assert len(forced.calls) == 2 and n == 1 and budget == 100 - len(call) - 1 - len(suffix)
    assert out.tool_mask is not None and out.turns is not None
    for b in range(4):
        prompt = prompts[b // 2]
        ids, mask, logps = out.completion_ids[b], out.tool_mask[b], out.logprobs[b]
        expected_first = call + [eos] if b in called else answer + [eos]
        first = teacher_forced_logprobs(model, prompt, expected_first, 1.0)
        if b not in called:  # answered without a call: one turn, sampled once
            assert ids == expected_first and mask == [1] * len(ids)
            assert len(out.turns[b]) == 1 and out.finish_reason[b] == "eos"
            torch.testing.assert_close(logps, first, atol=AGREE, rtol=0)
            continue
        turn1 = call + [eos]
        assert ids == turn1 + suffix + answer + [eos]
        assert contexts == [prompt + turn1 + suffix]  # only this row, from its own context
        assert mask == [1] * len(turn1) + [0] * len(suffix) + [1] * (len(answer) + 1)
        # vLLM's log-probs of each turn are the model's given that turn's context; 0 at tools.
        second = teacher_forced_logprobs(model, prompt + turn1 + suffix, answer + [eos], 1.0)
        torch.testing.assert_close(logps[: len(turn1)], first, atol=AGREE, rtol=0)
        assert torch.all(logps[len(turn1) : len(turn1) + len(suffix)] == 0)
        torch.testing.assert_close(logps[len(turn1) + len(suffix) :], second, atol=AGREE, rtol=0)
        t1, t2 = out.turns[b]
        assert (t1.end, t1.tool_end, t2.end) == (len(turn1), len(turn1) + len(suffix), len(ids))
        assert [c.content for c in t1.calls] == ["12"]
        assert out.finish_reason[b] == "eos"
    metrics = tool_metrics(out, ["calculator"])
    assert metrics["tools/call_frequency"] == 1 / 4 and metrics["turns/max"] == 2.0


def test_turn_one_ids_are_never_changed_by_turn_two_on_vllm(
    vllm_setup: tuple[VLLMEngine, Any, Any, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM samples ids that a re-tokenization of their text would merge (one character a token
    here); turn 2 is sampled from exactly those ids plus the tool message's, and they stay."""
    engine, _, tokenizer, tools = vllm_setup
    eos = int(tokenizer.eos_token_id)
    text = hermes_call("calculator", a=6, b=7)
    call = [i for ch in text for i in _ids(tokenizer, ch)]
    assert call != _ids(tokenizer, text), "the test needs ids a re-tokenization changes"
    answer = [i for ch in " It is 42." for i in _ids(tokenizer, ch)]
    forced = _forced(monkeypatch, [lambda i: call, lambda i: answer], eos)
    rollout = _rollout(tokenizer, tools)
    prompt = encode_prompt(tokenizer, "What is 6 times 7?", tools=rollout.schemas)
    out = rollout.generate(
        forced.wrap(engine), [prompt], 1, SamplingParams(max_completion_length=300)
    )
    turn1 = call + [eos]
    suffix = _ids(tokenizer, CHATML_TOOL.format("42") + CHATML_NEXT)
    ids = out.completion_ids[0]
    assert ids[: len(turn1)] == turn1
    assert ids == turn1 + suffix + answer + [eos]
    assert forced.calls[1][0] == [prompt + turn1 + suffix]  # the next input: ids concatenated
    assert out.tool_mask == [[1] * len(turn1) + [0] * len(suffix) + [1] * (len(answer) + 1)]


REWARD = """
def right_answer(prompts, completions, **columns):
    return [1.0 if "<tool_response>42" in c and c.endswith("It is 42.") else 0.0
            for c in completions]
"""


def test_grpo_steps_with_tools_on_vllm(
    vllm_tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tools:` with `use_vllm: true`: each step's turns are sampled by vLLM (the first row of
    each group calls the calculator), the tool metrics are logged, and the policy's updated
    weights reach vLLM between steps."""
    import yaml

    from grpokit.config import load_config
    from grpokit.train import setup
    from grpokit.train.trainer import GRPOTrainer

    (tmp_path / "my_tools.py").write_text(TOOLS_MODULE)
    (tmp_path / "my_rewards.py").write_text(REWARD)
    (tmp_path / "train.jsonl").write_text(
        "".join(f'{{"prompt": "What is 6 times 7? ({i})"}}\n' for i in range(4))
    )
    doc = {
        "model": {"name_or_path": str(vllm_tiny_model_dir), "chat_template": "hermes"},
        "data": {"train": "train.jsonl"},
        "rewards": [{"type": "python", "name": "right", "function": "my_rewards.py:right_answer"}],
        "tools": ["my_tools.py:calculator"],
        "training": {"use_vllm": True, "vllm_gpu_memory_utilization": 0.05,
                     "num_generations": 4, "per_device_train_batch_size": 4,
                     "max_completion_length": 64, "max_steps": 2, "learning_rate": 1e-2,
                     "report_to": ["none"], "output_dir": "run"},
    }  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(doc))
    tokenizer = AutoTokenizer.from_pretrained(vllm_tiny_model_dir)
    eos = int(tokenizer.eos_token_id)
    call = _ids(tokenizer, hermes_call("calculator", a=6, b=7))
    wrong, right = _ids(tokenizer, "It is 41."), _ids(tokenizer, "It is 42.")
    first: Script = lambda i: call if i == 0 else wrong  # noqa: E731
    forced = _forced(monkeypatch, [first, lambda i: right] * 2, eos)
    built: list[VLLMEngine] = []

    def build(cfg: Any, policy: Any, *, sharded: bool) -> Any:
        built.append(setup.build_engine(cfg, policy, sharded=sharded))
        return forced.wrap(built[-1])

    monkeypatch.setattr("grpokit.train.trainer.build_engine", build)
    trainer = GRPOTrainer(load_config(tmp_path / "config.yaml"), progress=False, log=print)
    history = trainer.train().history
    assert isinstance(built[0], VLLMEngine) and not forced.scripts  # 2 steps x 2 turns
    assert [h["tools/call_frequency"] for h in history] == [0.25, 0.25]
    assert [h["turns/max"] for h in history] == [2.0, 2.0]
    assert [h["rewards/right/mean"] for h in history] == [0.25, 0.25]
    # vLLM's log-probs of the model's tokens (tool tokens masked out) are the policy's, also
    # after the first update: its weights were synced.
    assert all(h["mismatch/kl"] < AGREE for h in history), [h["mismatch/kl"] for h in history]
