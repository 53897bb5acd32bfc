"""A local judge endpoint: llama.cpp's own OpenAI-compatible server on a GGUF file (by default the
embedded SmolLM2-135M-Instruct), through xllamacpp (an optional dependency).

    python -m grpokit.rewards.judge.local_server [--model F.gguf] [--alias smollm2] [--port P]
        [--host 127.0.0.1] [--ctx 2048] [--threads N] [--parallel N] [--exit-with-stdin]

It prints ``listening on http://HOST:PORT/v1`` once it answers and serves until SIGTERM or
SIGINT. ``scripts/judge_server.sh`` and the judge tests start it. xllamacpp ships llama.cpp's
server (the C++ ``llama-server``: chat completions, ``logprobs`` with ``top_logprobs``, the
``grammar`` request field) compiled into a prebuilt wheel, so nothing is built at install; the
server answers one request at a time (one slot, ``--parallel`` for more), as the judge tests
expect of it; ``backend: llama_server`` judges start it this way.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

XLLAMACPP_REQUIREMENT = "xllamacpp>=2026.10.11549"
"""The versions whose parameter names this module uses (``scripts/setup.sh`` pins one)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m grpokit.rewards.judge.local_server",
        description="llama.cpp's OpenAI-compatible server on a GGUF file (xllamacpp).",
    )
    parser.add_argument("--model", help="the GGUF file (default: the embedded SmolLM2 model)")
    parser.add_argument("--alias", default="smollm2", help="the model name requests use")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--ctx", type=int, default=2048, help="context length")
    parser.add_argument(
        "--threads", type=int, default=1, help="threads, for generating and reading prompts"
    )
    parser.add_argument(
        "--parallel", type=int, default=1, help="slots: requests served at once (--ctx is shared)"
    )
    parser.add_argument(
        "--exit-with-stdin",
        action="store_true",
        help="also stop when stdin reaches end of file (the parent that piped it has gone)",
    )
    return parser


def serve(args: argparse.Namespace) -> Any:
    """Start the server described by ``args`` (see :func:`_parser`); returns xllamacpp's Server,
    which serves from its own threads while it is referenced."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {args.alias}
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx
    params.n_parallel = args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    return xllamacpp.Server(params)


@dataclass
class ServerProcess:
    """This module run as a child process (:func:`start_process`)."""

    base_url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL after 10 s) and close its stdin."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stdin is not None:
            self.process.stdin.close()


def start_process(
    gguf: Path,
    *,
    alias: str,
    log: Path,
    ctx: int = 2048,
    threads: int = 1,
    parallel: int = 1,
    timeout_s: float = 120.0,
) -> ServerProcess:
    """Start the server on ``gguf`` as a child process on a free local port, its output in
    ``log``, and wait until it answers. It also stops when this process goes away (its stdin,
    a pipe from here, reaches end of file), so a crash leaves no server behind. Raises
    RuntimeError, with the end of the log, when it exits or stays silent for ``timeout_s``."""
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        sys.executable, "-m", "grpokit.rewards.judge.local_server",
        "--model", str(gguf), "--alias", alias, "--host", "127.0.0.1", "--port", str(port),
        "--ctx", str(ctx), "--threads", str(threads), "--parallel", str(parallel),
        "--exit-with-stdin",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT
        )
    server = ServerProcess(f"http://127.0.0.1:{port}/v1", process, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            server.stop()
            raise RuntimeError(
                f"llama.cpp's server on {gguf} exited at start (code {process.returncode}); the "
                f"end of its log {log}:\n{log.read_text(errors='replace')[-1500:]}"
            )
        try:
            if httpx.get(f"{server.base_url}/models", timeout=1.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    server.stop()
    raise RuntimeError(
        f"llama.cpp's server on {gguf} did not answer within {timeout_s:g} s; its log: {log}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.model is None:
        from grpokit.hub.embedded import find_embedded_gguf

        try:
            args.model = str(find_embedded_gguf())
        except Exception as exc:  # the embedded model's package is missing or damaged
            print(f"no --model, and the embedded model: {exc}", file=sys.stderr)
            return 2
    try:
        import xllamacpp  # noqa: F401
    except ImportError:
        print(
            f"llama.cpp's server comes with xllamacpp (prebuilt wheels); install it "
            f"(pip install '{XLLAMACPP_REQUIREMENT}')",
            file=sys.stderr,
        )
        return 2
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    if args.exit_with_stdin:

        def watch_stdin() -> None:
            while sys.stdin.buffer.read(4096):
                pass
            stop.set()

        threading.Thread(target=watch_stdin, daemon=True).start()
    try:
        server = serve(args)
    except Exception as exc:  # llama.cpp's own message: a bad file, a port in use ...
        print(f"the server did not start: {exc}", file=sys.stderr)
        return 1
    print(f"listening on {server.listening_address}/v1", flush=True)
    stop.wait()
    # xllamacpp's server threads are not joined at interpreter exit: leave at once, as the
    # server would on SIGTERM.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
