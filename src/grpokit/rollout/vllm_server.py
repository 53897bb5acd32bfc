"""vLLM's OpenAI-compatible server as a rollout server whose weights arrive as files, not NCCL.

vLLM's CPU backend (and a trainer without a GPU) has no NCCL, so TRL's server and its weight
push do not apply there. Instead the trainer writes the policy's dense weights as one
safetensors file into a directory the server can read (``/dev/shm`` by default: memory, not
disk) and asks the server to reload from it. The server is vLLM's own, started with two extras:

- ``VLLM_SERVER_DEV_MODE=1``, which opens its ``/collective_rpc`` and ``/reset_prefix_cache``
  endpoints;
- ``--worker-extension-cls`` :data:`EXTENSION`, which adds :meth:`WeightFileReload.
  grpokit_reload_weights` to vLLM's worker: vLLM's in-place reload from that file, then the CPU
  backend's repacking of a tied output layer (see
  :func:`grpokit.rollout.vllm_engine.refresh_tied_packed_layers`).

:func:`server_command` gives the command line; :func:`start_server` runs it. Generation goes
through ``/v1/completions`` with token ids in and out (``return_token_ids``) and the sampled
tokens' log-probs (``logprobs: 0``; with ``--logprobs-mode processed_logprobs``, after
temperature and top-k / top-p, renormalised over the kept tokens, as the trainer scores them).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import torch

from grpokit.errors import UserError

EXTENSION = "grpokit.rollout.vllm_server.WeightFileReload"
"""What ``--worker-extension-cls`` names for the file reload."""

RELOAD_METHOD = "grpokit_reload_weights"

SYNC_DIR_ENV = "GRPOKIT_VLLM_SYNC_DIR"
"""Directory both trainer and server see, for the weights file; default /dev/shm (or the temp
directory where there is none)."""


class WeightFileReload:
    """Mixed into vLLM's worker by ``--worker-extension-cls`` (so ``self`` is the worker)."""

    def grpokit_reload_weights(self, path: str) -> int:
        """Reload the model in place from the safetensors file at ``path``; returns how many
        tensors it held."""
        from safetensors import safe_open

        from grpokit.rollout.vllm_engine import refresh_tied_packed_layers

        worker: Any = self
        names: list[str] = []

        def weights() -> Iterator[tuple[str, torch.Tensor]]:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    names.append(name)
                    yield name, f.get_tensor(name)

        worker.reload_weights(weights_iterator=weights(), is_checkpoint_format=True)
        if worker.device.type == "cpu":
            refresh_tied_packed_layers(worker.model_runner.get_model())
        return len(names)


def sync_dir() -> Path:
    env = os.environ.get(SYNC_DIR_ENV)
    if env:
        return Path(env)
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def server_command(
    model_path: str,
    *,
    port: int,
    dtype: str,
    host: str = "127.0.0.1",
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    gpu_memory_utilization: float | None = None,
    enforce_eager: bool = False,
    python: str = sys.executable,
) -> list[str]:
    """The command line of a vLLM server that :class:`ServerClient` can drive (run it with
    ``VLLM_SERVER_DEV_MODE=1`` in the environment, as :func:`start_server` does); the memory
    arguments as :func:`grpokit.rollout.vllm_engine.memory_args` gives them."""
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_path,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--logprobs-mode",
        "processed_logprobs",
        "--enable-prefix-caching",
        "--worker-extension-cls",
        EXTENSION,
    ]
    options = {
        "--max-model-len": max_model_len,
        "--max-num-seqs": max_num_seqs,
        "--kv-cache-memory-bytes": kv_cache_memory_bytes,
        "--gpu-memory-utilization": gpu_memory_utilization,
    }
    for flag, value in options.items():
        if value is not None:
            cmd += [flag, str(value)]
    if enforce_eager:  # on CPU: see VLLMEngine (vLLM's compilation costs more than it gains)
        cmd.append("--enforce-eager")
    return cmd


def start_server(cmd: list[str], *, log: Path, timeout: float = 300.0) -> subprocess.Popen[bytes]:
    """Start the server of ``cmd`` (from :func:`server_command`), its output into ``log``, and
    wait until it answers; raises if it exits or does not answer within ``timeout`` seconds."""
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    port = cmd[cmd.index("--port") + 1]
    host = cmd[cmd.index("--host") + 1]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://{host}:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the vLLM server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    proc.terminate()
    raise RuntimeError(f"the vLLM server did not answer within {timeout:.0f} s; see {log}")


def write_weights(weights: Iterable[tuple[str, torch.Tensor]]) -> Path:
    """The weights as one safetensors file in :func:`sync_dir`, for :meth:`ServerClient.reload`
    (a snapshot: training may change the tensors once this returns)."""
    from safetensors.torch import save_file

    tensors = {name: t.detach().to("cpu").contiguous() for name, t in weights}
    fd, tmp = tempfile.mkstemp(prefix="grpokit-weights-", suffix=".safetensors", dir=sync_dir())
    os.close(fd)
    try:
        save_file(tensors, tmp)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


class ServerClient:
    """Generation and weight pushes against a server started by :func:`server_command`."""

    def __init__(self, base_url: str, *, timeout: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout)
        try:
            models = self.http.get("/v1/models").raise_for_status().json()["data"]
        except httpx.HTTPError as e:
            raise UserError(
                f"training.vllm_server_base_url: no vLLM server answers at {self.base_url} ({e}); "
                "start one as docs/vllm.md shows"
            ) from None
        self.model: str = models[0]["id"]

    def push_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Write the weights as one safetensors file the server can read, and have it reload."""
        self.reload(write_weights(weights))

    def reload(self, path: Path) -> None:
        """Have the server reload from a file of :func:`write_weights`; the file is removed."""
        try:
            reply = self.http.post(
                "/collective_rpc", json={"method": RELOAD_METHOD, "kwargs": {"path": str(path)}}
            )
            if reply.status_code == 404:
                raise UserError(
                    f"the vLLM server at {self.base_url} does not take weight pushes: start it "
                    f"with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls {EXTENSION} "
                    "(docs/vllm.md)"
                )
            reply.raise_for_status()
            self.http.post("/reset_prefix_cache").raise_for_status()
        finally:
            path.unlink(missing_ok=True)

    def generate(
        self, prompt_ids: list[list[int]], body: dict[str, Any], copies: int
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Completions (token ids) and their tokens' log-probs, group-major: each prompt is sent
        ``copies`` times with ``body['n']`` samples each."""
        prompts = [ids for ids in prompt_ids for _ in range(copies)]
        payload = {
            "model": self.model,
            "prompt": prompts,
            "logprobs": 0,
            "return_token_ids": True,
            **body,
        }
        choices = self.http.post("/v1/completions", json=payload).raise_for_status().json()
        ordered = sorted(choices["choices"], key=lambda c: c["index"])
        completions = [list(c["token_ids"]) for c in ordered]
        logprobs = [[float(x) for x in c["logprobs"]["token_logprobs"]] for c in ordered]
        return completions, logprobs
