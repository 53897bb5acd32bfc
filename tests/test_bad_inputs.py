"""A corpus of malformed configs, data files and command lines, each run through the `grpokit`
command in-process: every one must end with exit code 2, one message naming the file or option,
no traceback, and nothing written. The errors are all found before training starts, most before
a model loads.

The checkpoint corpus below damages what grpokit itself wrote (each file truncated, emptied,
replaced or deleted; tensors of the wrong shape or dtype; trainer-state fields missing or of the
wrong type) and reads it back with every command that reads checkpoints."""

from __future__ import annotations

import json
import shutil
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


def long_prompt_case(name: str, prompt: str, **training: Any) -> Case:
    """The valid config without max_prompt_length, its second prompt past the model's context
    (the tiny model's 2048 tokens)."""

    def build(d: Path, model: Path) -> list[str]:
        doc = _set(_valid(model), "training.max_prompt_length", None)
        for key, value in training.items():
            _set(doc, f"training.{key}", value)
        rows = [{"prompt": "1+1?", "answer": "2"}, {"prompt": prompt, "answer": "1"}]
        path = _write(d, doc, data="".join(json.dumps(r) + "\n" for r in rows))
        return ["train", str(path), "--no-progress"]

    return Case(f"context:{name}", build, "train.jsonl:2")


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
    "vespo_k_pos": 1.0,
    "num_generations_eval": 4,
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
    config_case("training.save_minutes", RAW, ".inf", names="write save_minutes: 0"),
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
    # ---- prompts past the model's context, found before a step tries them
    long_prompt_case("9390 tokens", "word " * 9389),
    long_prompt_case("2040 tokens and 16 to complete", "word " * 2040, max_completion_length=16),
    long_prompt_case("10 MB", "a" * 10_000_000),
    # ---- command lines
    cli_case("nproc 0", lambda c: ["train", str(c), "--nproc", "0"], "--nproc"),
    cli_case("nproc -2", lambda c: ["train", str(c), "--nproc", "-2"], "--nproc"),
    cli_case("nproc text", lambda c: ["train", str(c), "--nproc", "two"], "--nproc"),
    cli_case("nnodes 0", lambda c: ["train", str(c), "--nnodes", "0"], "--nnodes"),
    cli_case(
        "nnodes without address", lambda c: ["train", str(c), "--nnodes", "2"], "--master-addr"
    ),
    cli_case(
        "node rank past nnodes",
        lambda c: ["train", str(c), "--nnodes", "2", "--node-rank", "2", "--master-addr", "h"],
        "--node-rank",
    ),
    cli_case(
        "address without nnodes", lambda c: ["train", str(c), "--master-addr", "h"], "--nnodes"
    ),
    cli_case("master port 0", lambda c: ["train", str(c), "--master-port", "0"], "--master-port"),
    cli_case(
        "port without nnodes", lambda c: ["train", str(c), "--master-port", "29400"], "--nnodes"
    ),
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
    cli_case(
        "set save_minutes inf",
        lambda c: ["train", str(c), "--set", "training.save_minutes=.inf"],
        "write save_minutes: 0",
    ),
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


# ---- checkpoints: what grpokit wrote, damaged, read back by every command that reads one -------

CKPT_REWARD = """
def letter_e(prompts, completions, **columns):
    return [c.count("e") / max(1, len(c)) for c in completions]
"""
TRAINER_FILES = ["trainable.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt", "trainer_state.json"]  # fmt: skip
ADAPTER_FILES = ["model/adapter_model.safetensors", "model/adapter_config.json"]
MODEL_FILES = [*ADAPTER_FILES, "model/grpokit_policy.json", "model/tokenizer.json", "model/tokenizer_config.json"]  # fmt: skip
READERS = ("train", "eval", "generate", "export", "export-gguf")
"""The commands that read a checkpoint: resume (all of it), the others its model/ (a GGUF
export only where the checkpoint is refused: converting one takes longer than the rest)."""


@dataclass(frozen=True)
class Damage:
    id: str
    apply: Callable[[Path], None]
    """Damages the checkpoint directory given."""
    names: str
    """The path (relative to the checkpoint) the message must name."""
    legacy: bool = False
    """Applied to a checkpoint without a manifest (as the previous release wrote them)."""
    loads: bool = False
    """Not a damage: the checkpoint still loads (exit 0, no fall-back)."""
    readers: tuple[str, ...] = ()
    """The commands it is run through (default: resume, and the others for model/ files)."""
    full: bool = False
    """Applied to a full fine-tuning run's checkpoint (else a LoRA run's)."""


def _truncate(rel: str) -> Callable[[Path], None]:
    def apply(ckpt: Path) -> None:
        data = (ckpt / rel).read_bytes()
        (ckpt / rel).write_bytes(data[: len(data) // 2])

    return apply


def _empty(rel: str) -> Callable[[Path], None]:
    return lambda ckpt: (ckpt / rel).write_bytes(b"")


def _garbage(rel: str) -> Callable[[Path], None]:
    def apply(ckpt: Path) -> None:  # the same size: only the contents tell
        size = (ckpt / rel).stat().st_size
        (ckpt / rel).write_bytes((b"\x07garbage\xff" * (size // 10 + 1))[:size])

    return apply


def _delete(rel: str) -> Callable[[Path], None]:
    return lambda ckpt: (ckpt / rel).unlink()


def _legacy(apply: Callable[[Path], None]) -> Callable[[Path], None]:
    def both(ckpt: Path) -> None:
        (ckpt / "manifest.json").unlink()
        apply(ckpt)

    return both


def _edit_tensor(
    rel: str, change: Callable[[Any], Any], pick: str = "lora_A"
) -> Callable[[Path], None]:
    def apply(ckpt: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(ckpt / rel))
        name = next(n for n in sorted(tensors) if pick in n)
        tensors[name] = change(tensors[name]).contiguous()
        save_file(tensors, str(ckpt / rel), metadata={"format": "pt"})

    return apply


def _edit_state(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def apply(ckpt: Path) -> None:
        path = ckpt / "trainer_state.json"
        path.write_text(json.dumps(change(json.loads(path.read_text()))))

    return apply


WAYS = {"truncated": _truncate, "emptied": _empty, "garbage": _garbage, "deleted": _delete}
TENSORS = {
    "one-row slice": lambda t: t[:1],
    "float16": lambda t: t.half(),
}
STATES = {
    "only global_step": lambda s: {"global_step": s["global_step"]},
    "global_step three": lambda s: {**s, "global_step": "three"},
    "unknown key": lambda s: {**s, "learning_rate": 0.1},
    "negative position": lambda s: {**s, "position": -1},
    "a list": lambda s: [s],
}


def _damages() -> list[Damage]:
    out = []
    for rel in [*TRAINER_FILES, *MODEL_FILES, "config.yaml"]:
        out += [Damage(f"{rel} {w}", way(rel), rel) for w, way in WAYS.items()]
    for rel in [*TRAINER_FILES, *ADAPTER_FILES]:
        out += [Damage(f"legacy {rel} {w}", _legacy(way(rel)), rel, legacy=True) for w, way in WAYS.items()]  # fmt: skip
    out += [Damage(f"manifest.json {w}", WAYS[w]("manifest.json"), "manifest.json") for w in ("truncated", "emptied", "garbage")]  # fmt: skip
    out.append(Damage("manifest.json deleted", _delete("manifest.json"), "", loads=True))
    for rel in ("trainable.safetensors", "model/adapter_model.safetensors"):
        for t, change in TENSORS.items():
            out.append(Damage(f"{rel} {t}", _edit_tensor(rel, change), rel))
    for t, change in TENSORS.items():
        edit = _legacy(_edit_tensor("trainable.safetensors", change))
        out.append(Damage(f"legacy trainable.safetensors {t}", edit, "trainable.safetensors", legacy=True))  # fmt: skip
    # Without a manifest an adapter's tensors are checked by peft against the base model: a
    # wrong shape is refused there (naming the adapter's directory). Resume reads
    # trainable.safetensors, not the adapter. (A float16 copy of the same values loads.)
    edit = _legacy(_edit_tensor("model/adapter_model.safetensors", TENSORS["one-row slice"]))
    out.append(Damage("legacy model/adapter_model.safetensors one-row slice", edit, "model", legacy=True, readers=READERS[1:]))  # fmt: skip
    # Full fine-tuning: the whole model in model/model.safetensors (and trainable.safetensors).
    full = "model/model.safetensors"
    out += [Damage(f"full {full} {w}", WAYS[w](full), full, full=True) for w in ("truncated", "garbage", "deleted")]  # fmt: skip
    out += [Damage(f"full model/config.json {w}", WAYS[w]("model/config.json"), "model/config.json", full=True) for w in ("garbage", "deleted")]  # fmt: skip
    for rel in (full, "trainable.safetensors"):
        slice_ = _edit_tensor(rel, TENSORS["one-row slice"], pick="down_proj")
        out.append(Damage(f"full {rel} one-row slice", slice_, rel, full=True))
    # Without a manifest: resume checks trainable.safetensors against the model; eval and
    # export load model/, where transformers refuses the shape (the message names model/).
    slice_ = _edit_tensor("trainable.safetensors", TENSORS["one-row slice"], pick="down_proj")
    out.append(Damage("full legacy trainable.safetensors one-row slice", _legacy(slice_), "trainable.safetensors", legacy=True, full=True))  # fmt: skip
    slice_ = _edit_tensor(full, TENSORS["one-row slice"], pick="down_proj")
    out.append(Damage(f"full legacy {full} one-row slice", _legacy(slice_), "model", legacy=True, full=True, readers=READERS[1:]))  # fmt: skip
    for s, change in STATES.items():
        out.append(Damage(f"trainer_state.json {s}", _edit_state(change), "trainer_state.json"))
        out.append(Damage(f"legacy trainer_state.json {s}", _legacy(_edit_state(change)), "trainer_state.json", legacy=True))  # fmt: skip
    return out


DAMAGES = _damages()


def _reads(command: str, damage: Damage) -> bool:
    """Whether ``command`` reads what ``damage`` damaged (else the pair is not run)."""
    if damage.readers:
        return command in damage.readers
    if command == "export-gguf" and damage.loads:
        return False
    if command == "train":
        return True
    return damage.names.startswith("model") or damage.names == "manifest.json" or damage.loads


CKPT_CASES = [(c, d) for d in DAMAGES for c in READERS if _reads(c, d)]


def _train_run(d: Path, model: Path, lora: bool) -> Path:
    """A run of 2 steps with checkpoint-1 and checkpoint-2 in ``d/run``."""
    (d / "rewards.py").write_text(CKPT_REWARD)
    (d / "train.jsonl").write_text("".join(json.dumps({"prompt": f"Say {w}."}) + "\n" for w in ("hi", "yes", "bread", "tea")))  # fmt: skip
    (d / "prompts.jsonl").write_text(json.dumps({"prompt": "Say hello."}) + "\n")
    doc = {
        "model": {"name_or_path": str(model), **({"lora": {"r": 4, "alpha": 8}} if lora else {})},
        "data": {"train": "train.jsonl"},
        "rewards": [{"type": "python", "name": "e", "function": "rewards.py:letter_e"}],
        "training": {
            "output_dir": str(d / "run"),
            "learning_rate": 1e-3,
            "num_generations": 2,
            "per_device_train_batch_size": 2,
            "max_completion_length": 4,
            "max_steps": 2,
            "save_steps": 1,
            "report_to": "none",
        },
    }
    (d / "config.yaml").write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(main, ["train", str(d / "config.yaml"), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (d / "run").glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]  # fmt: skip
    return d / "run"


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A LoRA run, shared (copied) by the cases."""
    return _train_run(tmp_path_factory.mktemp("ckpt-run"), tiny_model_dir, lora=True)


@pytest.fixture(scope="module")
def trained_full_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A full fine-tuning run, shared (copied) by its cases."""
    return _train_run(tmp_path_factory.mktemp("ckpt-full-run"), tiny_model_dir, lora=False)


def _command(command: str, run: Path, prompts: Path, out: Path) -> list[str]:
    ckpt = str(run / "checkpoint-2")
    return {
        # max_steps 1: a fall-back to checkpoint-1 has nothing left to train.
        "train": ["train", str(run), "--no-progress", "--set", "training.max_steps=1"],
        "eval": [
            "eval",
            "--model",
            str(run),
            "--prompts",
            str(prompts),
            "--samples",
            "1",
            "--out",
            str(out),
        ],  # fmt: skip
        "generate": [
            "generate",
            "--model",
            ckpt,
            "--prompt",
            "Say hi.",
            "--samples",
            "1",
            "--max-new-tokens",
            "2",
        ],  # fmt: skip
        "export": ["export", ckpt, "--format", "hf", "--out", str(out)],
        "export-gguf": ["export", str(run), "--format", "gguf", "--out", str(out) + ".gguf"],
    }[command]


def test_the_checkpoint_corpus_covers_every_file_and_reader() -> None:
    assert len(DAMAGES) >= 80 and len({d.id for d in DAMAGES}) == len(DAMAGES)
    for command in READERS:
        assert sum(c == command for c, _ in CKPT_CASES) >= 20, command


@pytest.mark.parametrize("command,damage", CKPT_CASES, ids=[f"{c}:{d.id}" for c, d in CKPT_CASES])
def test_a_damaged_checkpoint_is_named_and_refused_or_passed_over(
    command: str, damage: Damage, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    trained_run: Path = request.getfixturevalue(
        "trained_full_run" if damage.full else "trained_run"
    )
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    damage.apply(run / "checkpoint-2")
    result = CliRunner().invoke(
        main, _command(command, run, trained_run.parent / "prompts.jsonl", tmp_path / "out")
    )
    out = result.output
    assert "Traceback" not in out, out
    assert result.exception is None or isinstance(result.exception, SystemExit), (result.exception, out)  # fmt: skip
    if damage.loads:
        assert result.exit_code == 0, out
        assert "is damaged" not in out and "error" not in out, out
        return
    named = str(run / "checkpoint-2" / damage.names)
    if command == "train":  # falls back to checkpoint-1, saying which and why
        assert result.exit_code == 0, out
        assert f"checkpoint-2 is damaged: {named}" in out, out
        assert "resuming from checkpoint-1, the newest intact checkpoint, at step 1" in out, out
        changes = (run / "config_changes.jsonl").read_text().splitlines()
        assert json.loads(changes[-1])["step"] == 1  # the --set applies from the step resumed at
        return
    assert result.exit_code == 2, out
    assert named in out, out
    assert sum(line.lower().startswith("error:") for line in out.splitlines()) == 1, out
    if command in ("eval", "export-gguf") and damage.names != "model":
        # Given a run directory, they name its newest intact checkpoint to give instead.
        assert f"The newest intact one is {run / 'checkpoint-1'}" in out, out


def test_with_no_intact_checkpoint_resume_is_one_message(trained_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    _garbage("trainable.safetensors")(run / "checkpoint-1")
    _legacy(_edit_state(STATES["global_step three"]))(run / "checkpoint-2")
    result = CliRunner().invoke(main, ["train", str(run), "--no-progress"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    assert "no intact checkpoint to resume from" in errors[0]
    assert str(run / "checkpoint-1" / "trainable.safetensors") in errors[0]
    assert f"{run / 'checkpoint-2' / 'trainer_state.json'}: field 'global_step' is 'three'" in errors[0]  # fmt: skip


def test_a_fall_back_ends_bitwise_equal_to_the_intact_run(
    trained_run: Path, tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import load_file

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    intact = load_file(str(trained_run / "checkpoint-2" / "trainable.safetensors"))
    _garbage("rng.pt")(run / "checkpoint-2")
    result = CliRunner().invoke(main, ["train", str(run), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "resuming from checkpoint-1, the newest intact checkpoint, at step 1" in result.output
    again = load_file(str(run / "checkpoint-2" / "trainable.safetensors"))
    assert sorted(again) == sorted(intact)
    assert all(torch.equal(again[n], intact[n]) for n in intact)


def test_long_prompts_are_dropped_with_a_count_when_asked(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    args = long_prompt_case("dropped", "word " * 9389).build(tmp_path, tiny_model_dir)
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2
    assert "train.jsonl:2 (9" in refused.output and "data.drop_long_prompts" in refused.output
    assert "2048 tokens, max_position_embeddings in its config.json" in refused.output
    result = CliRunner().invoke(main, [*args, "--set", "data.drop_long_prompts=true"])
    assert result.exit_code == 0, result.output
    assert "dropped 1 of 2 data.train prompts longer than the 2044 tokens" in result.output
