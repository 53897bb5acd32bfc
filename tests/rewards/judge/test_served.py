"""``backend: llama_server``: grpokit starts llama.cpp's server on a GGUF itself (the embedded
SmolLM2 here), judges through it, and stops it; the server also goes when grpokit's process is
killed without closing it; a model that is neither named nor a file is one clear error."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpokit.errors import UserError
from grpokit.rewards import BuildContext, build_reward_set
from grpokit.rewards.builtin.checklist import ChecklistParams, build_checklist
from grpokit.rewards.judge.backends.served import ServedBackend
from grpokit.rewards.spec import parse_reward_specs
from tests.rewards.results import evaluate

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("xllamacpp") is None, reason="xllamacpp is not installed"
)

QUESTIONS = [
    {"name": "price", "question": "Text: {completion}\nDoes the text state a price? "
                                  "Answer yes or no.\nAnswer:"},
    {"name": "customer", "question": "Text: {completion}\nDoes the text name a customer? "
                                     "Answer yes or no.\nAnswer:"},
]  # fmt: skip


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_a_served_judge_starts_answers_and_stops(tmp_path: Path) -> None:
    judge = {"backend": "llama_server", "max_tokens": 2, "threads": 2, "ctx": 1024}
    params = ChecklistParams.model_validate({"items": QUESTIONS, "judges": [judge]})
    completions = ["Meal kits for busy nurses at 30 USD a week.", "Something with computers."]
    checklist = build_checklist(params, BuildContext(base_dir=tmp_path, run_dir=tmp_path))
    try:
        (backend,) = checklist.backends
        served = backend.inner
        assert isinstance(served, ServedBackend)
        assert served.process.poll() is None
        assert served.description == f"llama.cpp server ({served.gguf.name})"
        # The cache identity names the model file, not the port of this run.
        assert served.base_url not in served.identity and served.gguf.name in served.identity
        result = evaluate(checklist, ["topic", "topic"], completions)
        parts, metrics = result.parts, result.metrics
    finally:
        checklist.close()
    for name in ("price", "customer"):
        assert metrics[f"judge/{name}/request_failure_rate"] == 0.0
        assert metrics[f"judge/{name}/expected_fallback_rate"] == 0.0
        values = parts[f"checklist/{name}"]
        assert all(v is not None and 0.0 <= v <= 1.0 for v in values)
    # Each completion's second question found its first one's prompt in the server's cache.
    assert metrics["judge/tokens_cached"] > 0
    assert _gone(served.process.pid, 15)
    assert not served.log.exists()


def test_the_server_goes_when_its_parent_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from grpokit.rewards.judge.backends.served import ServedBackend\n"
        "from grpokit.rewards.judge.config import LlamaServerJudge\n"
        "spec = LlamaServerJudge(backend='llama_server', ctx=512, threads=1)\n"
        "backend = ServedBackend(spec, where='judges[0]', base_dir=None)\n"
        "print(backend.process.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    # The killed parent cannot remove the server's log: it goes to this test's folder.
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        os.kill(child, 0)  # running
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert _gone(child, 15), "the judge server outlived the process that started it"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_model_that_is_neither_named_nor_a_gguf_file_is_named(tmp_path: Path) -> None:
    judge = {"backend": "llama_server", "model": "judge.gguf"}
    raw = [{"type": "checklist", "items": QUESTIONS[:1], "judges": [judge]}]
    with pytest.raises(UserError, match=r"judges\[0\]\.model: 'judge.gguf' is neither a named"):
        build_reward_set(parse_reward_specs(raw), BuildContext(base_dir=tmp_path))
