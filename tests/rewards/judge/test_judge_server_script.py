"""scripts/judge_server.sh: start llama.cpp's server on the embedded GGUF, find it, stop it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "judge_server.sh"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRPOKIT_VENV": sys.prefix}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=180, env=env
    )


def test_start_url_stop(tmp_path: Path) -> None:
    if importlib.util.find_spec("xllamacpp") is None:
        pytest.skip("xllamacpp is not installed")
    state = tmp_path / "server"
    started = _run("start", "--dir", str(state))
    try:
        assert started.returncode == 0, started.stderr
        url = started.stdout.strip().splitlines()[-1]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        models = httpx.get(f"{url}/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["smollm2"]
        reply = httpx.post(
            f"{url}/chat/completions",
            json={
                "model": "smollm2",
                "messages": [{"role": "user", "content": "Say hi."}],
                "max_tokens": 4,
            },
            timeout=60,
        ).json()
        assert reply["choices"][0]["message"]["content"]
        assert _run("url", "--dir", str(state)).stdout.strip() == url
        again = _run("start", "--dir", str(state))  # a second start finds the first
        assert again.returncode == 0 and "already running" in again.stderr
        assert again.stdout.strip() == url
        pid = int((state / "server.pid").read_text())
    finally:
        stopped = _run("stop", "--dir", str(state))
    assert stopped.returncode == 0, stopped.stderr
    assert not (state / "server.pid").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    gone = _run("url", "--dir", str(state))
    assert gone.returncode == 1 and "not running" in gone.stderr


def test_bad_usage_exits_2(tmp_path: Path) -> None:
    wrong = _run("start", "--bogus", "1")
    assert wrong.returncode == 2 and "unknown option --bogus" in wrong.stderr
    assert _run("restart").returncode == 2
    # stop without a server is not an error
    assert _run("stop", "--dir", str(tmp_path)).returncode == 0
