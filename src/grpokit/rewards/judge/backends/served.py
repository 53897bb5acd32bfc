"""``backend: llama_server``: a judge grpokit serves itself.

llama.cpp's server (:mod:`grpokit.rewards.judge.local_server`, through xllamacpp) is started as a
child process on a free local port when the reward is built, answers through the OpenAI
backend (so retries, logprobs, usage and the prompt-cache counts are the same code), and is
stopped when the reward is closed. The child also exits when grpokit's process goes away without
closing it (its stdin, a pipe from this process, reaches end of file), so no orphan server keeps
a port and the CPU after a crash.

The cache identity names the model file (its name and size) instead of the port, which changes
from run to run, so a judge cache written by one run answers the next.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from grpokit.errors import UserError
from grpokit.rewards.judge.backends.base import JudgeReply
from grpokit.rewards.judge.backends.openai import OpenAIBackend
from grpokit.rewards.judge.config import LlamaServerJudge, OpenAIJudge
from grpokit.rewards.judge.local_server import XLLAMACPP_REQUIREMENT, start_process

ALIAS = "judge"
"""The model name the started server answers to."""


def resolve_gguf(model: str, base_dir: Path | None, where: str) -> Path:
    """The GGUF file of ``model``: a named model's (joined once into the cache) or a file."""
    from grpokit.hub.named import gguf_file, named_model

    named = named_model(model)
    if named is not None:
        return gguf_file(named)
    path = Path(model).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if path.suffix.lower() != ".gguf" or not path.is_file():
        raise UserError(
            f"{where}.model: {model!r} is neither a named model (`grpokit models` lists them) "
            f"nor a .gguf file ({path} {'is not a .gguf file' if path.is_file() else 'not found'})."
        )
    return path


class ServedBackend:
    """A ``JudgeBackend``: llama.cpp's server on ``spec.model``, started now, stopped by
    :meth:`close`."""

    def __init__(self, spec: LlamaServerJudge, *, where: str, base_dir: Path | None) -> None:
        if importlib.util.find_spec("xllamacpp") is None:
            raise UserError(
                f"{where}: backend llama_server runs llama.cpp's server from xllamacpp, which is "
                f"not installed: run `make setup` (or pip install '{XLLAMACPP_REQUIREMENT}')."
            )
        self.gguf = resolve_gguf(spec.model, base_dir, where)
        self.log = Path(tempfile.mkstemp(prefix="grpokit-judge-server-", suffix=".log")[1])
        try:
            self.server = start_process(
                self.gguf,
                alias=ALIAS,
                log=self.log,
                ctx=spec.ctx * spec.max_concurrency,
                threads=spec.threads,
                parallel=spec.max_concurrency,
                timeout_s=spec.start_timeout_s,
            )
        except RuntimeError as exc:
            raise UserError(f"{where}: {exc} (start_timeout_s: {spec.start_timeout_s:g})") from exc
        self.base_url = self.server.base_url
        try:
            served = spec.model_dump(exclude={"backend", "threads", "ctx", "start_timeout_s"})
            self.inner = OpenAIBackend(
                OpenAIJudge.model_validate(
                    {**served, "backend": "openai", "base_url": self.base_url, "model": ALIAS}
                ),
                where=where,
            )
        except BaseException:
            self.server.stop()
            raise
        self._identity = json.dumps(
            ["llama_server", self.gguf.name, self.gguf.stat().st_size, self.inner.identity]
        ).replace(self.base_url, "")

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.server.process

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def description(self) -> str:
        return f"llama.cpp server ({self.gguf.name})"

    def complete(self, prompts: Sequence[str], *, logprobs: bool) -> list[JudgeReply]:
        return self.inner.complete(prompts, logprobs=logprobs)

    def check_reachable(self) -> None:
        self.inner.check_reachable()

    def close(self) -> None:
        self.inner.close()
        self.server.stop()
        self.log.unlink(missing_ok=True)
