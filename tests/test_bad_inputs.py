"""A corpus of malformed configs, data files and command lines, each run through the `grpokit`
command in-process: every one must end with exit code 2, one message naming the file or option,
no traceback, and nothing written. The errors are all found before a model loads."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from grpokit.cli import main

RAW = "@raw@"
"""A placeholder replaced by raw YAML text (.nan, [1, 2] ...) after the config is dumped."""


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[Path, Path], list[str]]
    """(directory, tiny model) -> the command line, after writing its files."""
    names: str
    """What the message must name: a file name or an option."""


def _valid(model: Path) -> dict[str, Any]:
    return {
        "model": {"name_or_path": str(model)},
        "data": {"train": "train.jsonl"},
        "rewards": [
            {"type": "xml_format"},
            {"type": "math_answer", "answer_column": "answer"},
        ],
        "training": {
            "output_dir": "out",
            "num_generations": 2,
            "per_device_train_batch_size": 2,
            "max_completion_length": 4,
            "max_prompt_length": 64,
            "max_steps": 1,
            "report_to": "none",
        },
    }


def _write(d: Path, doc: dict[str, Any], raw: str = "", data: str | None = None) -> Path:
    (d / "train.jsonl").write_text(
        data if data is not None else '{"prompt": "1+1?", "answer": "2"}\n', encoding="utf-8"
    )
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    (d / "config.yaml").write_text(text.replace(f"'{RAW}'", raw), encoding="utf-8")
    return d / "config.yaml"


def _set(doc: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    node: Any = doc
    *parents, last = dotted.split(".")
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    node[last] = value
    return doc


def config_case(key: str, value: Any, raw: str = "", names: str = "config.yaml") -> Case:
    """The valid config with one setting changed (``value`` RAW for raw YAML text)."""

    def build(d: Path, model: Path) -> list[str]:
        return ["train", str(_write(d, _set(_valid(model), key, value), raw)), "--no-progress"]

    return Case(f"config:{key}={raw or value!r}", build, names)


def text_case(name: str, edit: Callable[[str], str | bytes]) -> Case:
    """The valid config file's text (or bytes) edited."""

    def build(d: Path, model: Path) -> list[str]:
        path = _write(d, _valid(model))
        new = edit(path.read_text())
        path.write_bytes(new if isinstance(new, bytes) else new.encode())
        return ["train", str(path)]

    return Case(f"text:{name}", build, "config.yaml")


def data_case(name: str, content: bytes, file: str = "train.jsonl") -> Case:
    """The valid config reading a malformed data file."""

    def build(d: Path, model: Path) -> list[str]:
        path = _write(d, _set(_valid(model), "data.train", file))
        (d / file).write_bytes(content)
        return ["train", str(path)]

    return Case(f"data:{file}:{name}", build, file)


def cli_case(name: str, args: Callable[[Path], list[str]], names: str) -> Case:
    """A command line around the valid config (``args(config path)``)."""

    def build(d: Path, model: Path) -> list[str]:
        return args(_write(d, _valid(model)))

    return Case(f"cli:{name}", build, names)


FLOATS = [
    "learning_rate",
    "beta",
    "epsilon",
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "max_grad_norm",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "weight_decay",
    "warmup_ratio",
    "num_train_epochs",
    "vllm_gpu_memory_utilization",
]
INTS = [
    "num_generations",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_completion_length",
    "num_iterations",
    "logging_steps",
    "save_steps",
    "top_k",
]
CHOICES = {
    "loss_type": "ppo",
    "scale_rewards": "std",
    "lr_scheduler_type": "cosine_with_min_lr",
    "optim": "sgd",
    "report_to": "trackio",
    "save_strategy": "best",
    "eval_strategy": "epoch",
    "importance_sampling_level": "word",
    "vllm_mode": "remote",
    "advantage_estimator": "ppo",
}
TRL_REFUSED = {
    "deepspeed": "ds_config.json",
    "fp16": True,
    "push_to_hub": True,
    "torch_compile": True,
    "use_liger_kernel": True,
    "sync_ref_model": True,
    "model_init_kwargs": {"torch_dtype": "bfloat16"},
    "trust_remote_code": True,
    "auto_find_batch_size": True,
    "resume_from_checkpoint": "runs/x/checkpoint-5",
    "entropy_coef": 0.01,
    "generation_batch_size": 64,
}
CHAT_USER = {"role": "user", "content": "hi"}


def _json_line(obj: Any) -> bytes:
    return (json.dumps(obj) + "\n").encode()


CASES: list[Case] = [
    # ---- every number that must be finite and of its kind
    *(config_case(f"training.{f}", RAW, raw) for f in FLOATS for raw in (".nan", ".inf", "abc")),
    *(config_case(f"training.{f}", RAW, "[1, 2]") for f in FLOATS[:6]),
    *(config_case(f"training.{f}", RAW, raw) for f in INTS for raw in ("2.5", "many", "-3")),
    *(config_case(f"training.{k}", v) for k, v in CHOICES.items()),
    *(config_case(f"training.{k}", v) for k, v in TRL_REFUSED.items()),
    config_case("training.learning_rate", RAW, "-.inf"),
    config_case("training.learning_rate", 0),
    config_case("training.max_completion_length", 10**11),
    config_case("training.num_generations", 3),
    config_case("training.delta", 1.1),
    config_case("training.reward_weights", [1.0]),
    config_case("training.reward_weights", [1.0, RAW], ".nan"),
    config_case("training.report_to", "all"),
    config_case("training.report_to", ["none", "wandb"]),
    config_case("training.generation_kwargs", {"num_beams": 4}),
    config_case("training.generation_kwargs", {"top_p": 3}),
    config_case("training.generation_kwargs", "{not json"),
    config_case("training.chat_template_kwargs", {"tokenize": True}),
    config_case("training.fsdp", "full_shard hybrid"),
    config_case("training.logging_steps", 0.5),
    config_case("training.lerning_rate", 1e-5),
    config_case("training.model_name_or_path", "Qwen/Qwen2.5-0.5B"),
    config_case("model.device", "tpu"),
    config_case("model.device", "cuda:x"),
    config_case("model.dtype", "int8"),
    config_case("model.lora", {"r": 0}),
    config_case("model.lora", {"dropout": 1.5}),
    config_case("model.cpu_matmul", "mkl"),
    config_case("model.name_or_path", "./no/such/model"),
    config_case("model.lora", {"alpha": RAW}, ".inf"),
    config_case("data.train", 3),
    config_case("data.train", {"path": "train.jsonl", "config": "x"}),
    config_case("data.columns", ["question"]),
    config_case("data.system_prompt_file", "sys.txt", names="sys.txt"),
    config_case("data.prompt_column", "question", names="train.jsonl"),
    config_case("data.train", "missing.jsonl", names="missing.jsonl"),
    config_case("data.train", "train.xlsx", names="train.xlsx"),
    config_case("rewards", []),
    config_case("rewards", {"type": "xml_format"}),
    config_case("rewards.0.type", "xml_formt"),
    config_case("rewards.0.weight", RAW, ".nan"),
    config_case("rewards.1.gate", {"reward": "nope"}),
    *(
        config_case("rewards", [{"type": "xml_format"}, {"type": "checklist", "items": [item]}])
        for item in (
            {"name": "none"},
            {"name": "two", "regex": "x", "max_chars": 9},
            {"name": "re", "regex": "(x"},
            {"name": "blind", "question": "Priced? Yes or no."},
            {"name": "g", "regex": "x", "gate": {"reward": "nope"}},
        )
    ),
    config_case("monitors", RAW, "[1]"),
    config_case("model_name_or_path", "Qwen/Qwen2.5-0.5B"),
    config_case("dataset_name", "trl-lib/tldr"),
    config_case("learning_rate", 1e-5),
    config_case("modle", {}),
    # ---- the file itself
    text_case("latin-1 comment", lambda t: ("# café\n" + t).encode("latin-1")),
    text_case("latin-1 value", lambda t: t.replace(": out", ": sortie-é").encode("latin-1")),
    text_case("duplicate training key", lambda t: t + "  max_steps: 2\n"),
    text_case("duplicate section", lambda t: t + "training: {}\n"),
    text_case("unclosed bracket", lambda t: t + "  beta: [0.1\n"),
    text_case("bad indentation", lambda t: t.replace("  num_generations", "    num_generations")),
    text_case("top-level list", lambda t: "- model\n- data\n"),
    text_case("empty file", lambda t: ""),
    text_case("tab indentation", lambda t: t.replace("  max_steps", "\tmax_steps")),
    text_case(
        "both system prompts",
        lambda t: t.replace("data:\n", "data:\n  system_prompt: S\n  system_prompt_file: s.txt\n"),
    ),
    text_case("fsdp with vllm", lambda t: t + "  fsdp: true\n  use_vllm: true\n"),
    text_case("warmup twice", lambda t: t + "  warmup_steps: 0.1\n  warmup_ratio: 0.2\n"),
    # ---- data files
    data_case("invalid json", b'{"prompt": "a", "answer": "1"}\n{"prompt": \n'),
    data_case("array line", b"[1, 2]\n"),
    data_case("string line", b'"just text"\n'),
    data_case("no prompt column", b'{"question": "a", "answer": "1"}\n'),
    data_case("prompt missing in a row", b'{"prompt": "a", "answer": "1"}\n{"answer": "2"}\n'),
    data_case("empty prompt", b'{"prompt": " ", "answer": "1"}\n'),
    data_case("number prompt", b'{"prompt": 3, "answer": "1"}\n'),
    data_case("latin-1", '{"prompt": "café", "answer": "1"}\n'.encode("latin-1")),
    data_case("unknown role", _json_line({"prompt": [{"role": "human", "content": "hi"}]})),
    data_case("assistant only", _json_line({"prompt": [{"role": "assistant", "content": "x"}]})),
    data_case("message without content", _json_line({"prompt": [{"role": "user"}]})),
    data_case(
        "multimodal content",
        _json_line({"prompt": [{"role": "user", "content": [{"type": "text"}]}]}),
    ),
    data_case("empty message list", _json_line({"prompt": [], "answer": "1"})),
    data_case("empty file", b""),
    data_case("blank lines only", b"\n\n  \n"),
    data_case("missing reward column", _json_line({"prompt": [CHAT_USER]})),
    data_case("extra field", b"prompt,answer\na,1\nb,2,3\n", "train.csv"),
    data_case("short row", b"prompt,answer\na,1\nb\n", "train.csv"),
    data_case("duplicate header", b"prompt,prompt\na,1\n", "train.csv"),
    data_case("unnamed column", b"prompt,,answer\na,x,1\n", "train.csv"),
    data_case("latin-1", "prompt,answer\nnaïve,1\n".encode("latin-1"), "train.csv"),
    data_case("header only", b"prompt,answer\n", "train.csv"),
    data_case("empty prompt", b"prompt,answer\n,1\n", "train.csv"),
    data_case("array of numbers", b"[1, 2]", "train.json"),
    data_case("not json", b"{prompt: a}", "train.json"),
    data_case("empty array", b"[]", "train.json"),
    data_case("garbage", b"PAR1 not really", "train.parquet"),
    data_case("garbage", b"not arrow", "train.arrow"),
    data_case("unknown suffix", b"prompt\n", "train.tsv"),
    # ---- command lines
    cli_case("nproc 0", lambda c: ["train", str(c), "--nproc", "0"], "--nproc"),
    cli_case("nproc -2", lambda c: ["train", str(c), "--nproc", "-2"], "--nproc"),
    cli_case("nproc text", lambda c: ["train", str(c), "--nproc", "two"], "--nproc"),
    cli_case("set without =", lambda c: ["train", str(c), "--set", "training.beta"], "--set"),
    cli_case("set empty key", lambda c: ["train", str(c), "--set", "=1"], "--set"),
    cli_case("set empty part", lambda c: ["train", str(c), "--set", "training..beta=1"], "--set"),
    cli_case(
        "set inside a string",
        lambda c: ["train", str(c), "--set", "model.name_or_path.a.b=1"],
        "--set",
    ),
    cli_case(
        "set past a list", lambda c: ["train", str(c), "--set", "rewards.5.weight=1"], "--set"
    ),
    cli_case(
        "set list by name", lambda c: ["train", str(c), "--set", "rewards.x.weight=1"], "--set"
    ),
    cli_case(
        "set inf", lambda c: ["train", str(c), "--set", "training.learning_rate=.inf"], "--set"
    ),
    cli_case("set nan", lambda c: ["train", str(c), "--set", "training.beta=.nan"], "--set"),
    cli_case("set typo", lambda c: ["train", str(c), "--set", "training.bata=0.1"], "config.yaml"),
    cli_case("missing config", lambda c: ["train", str(c.parent / "nope.yaml")], "nope.yaml"),
    cli_case("not a run dir", lambda c: ["train", str(c.parent)], "not a grpokit run"),
    cli_case(
        "run dir with output dir",
        lambda c: ["train", str(c.parent), "--output-dir", str(c.parent / "x")],
        "--output-dir",
    ),
    cli_case("unknown option", lambda c: ["train", str(c), "--steps", "3"], "--steps"),
    cli_case(
        "eval batch 0",
        lambda c: ["eval", "--model", "m", "--prompts", "p.jsonl", "--batch-size", "0"],
        "--batch-size",
    ),
    cli_case(
        "eval samples 0",
        lambda c: ["eval", "--model", "m", "--prompts", "p.jsonl", "--samples", "0"],
        "--samples",
    ),
    cli_case(
        "eval max prompts 0",
        lambda c: ["eval", "--model", "m", "--prompts", "p.jsonl", "--max-prompts", "0"],
        "--max-prompts",
    ),
    cli_case(
        "eval device tpu",
        lambda c: ["eval", "--model", "m", "--prompts", "p.jsonl", "--device", "tpu"],
        "--device",
    ),
    cli_case("eval no model", lambda c: ["eval", "--prompts", "p.jsonl"], "--model"),
]


def _files(d: Path) -> dict[Path, bytes]:
    return {p.relative_to(d): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def test_the_corpus_is_large() -> None:
    assert len(CASES) >= 100
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gives_one_message_and_exit_2(
    case: Case, tmp_path: Path, tiny_model_dir: Path
) -> None:
    args = case.build(tmp_path, tiny_model_dir)
    files_before = _files(tmp_path)
    result = CliRunner().invoke(main, args)
    # An unexpected exception would give exit code 1 with the exception here, not SystemExit.
    assert isinstance(result.exception, SystemExit), (result.exception, result.output)
    assert result.exit_code == 2, result.output
    out = result.output
    assert "Traceback" not in out
    assert case.names in out, out
    assert sum(line.lower().startswith("error:") for line in out.splitlines()) == 1, out
    # Nothing written: no file added, changed or removed (an empty run directory at most).
    assert _files(tmp_path) == files_before
