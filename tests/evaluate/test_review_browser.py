"""`grpokit review` end to end: the real command serves the page, a real headless Chromium
clicks and presses keys, the labels land in SQLite, and the server stops and resumes."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cdp import CHROMIUM, Browser
from review_samples import HOSTILE, make_eval_dir, make_generate_file

from grpokit.evaluate.review_data import LabelStore, find_samples

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)"
)


@contextmanager
def review_server(*args: str) -> Iterator[tuple[str, list[str]]]:
    """``grpokit review ARGS`` in a subprocess: (its URL, its output lines once stopped). Stopped
    with SIGINT, as Ctrl-C does; it must then exit 0."""
    proc = subprocess.Popen(
        # faulthandler: a server that does not stop is aborted with every thread's traceback
        [sys.executable, "-X", "faulthandler", "-m", "grpokit", "review", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A shell that starts pytest in the background leaves SIGINT ignored, and children
        # inherit that; the server sets its own handler (test_review.py checks it alone).
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 180
        while not lines or "review: http" not in lines[0]:
            assert time.monotonic() < deadline, f"no URL printed: {lines}"
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline()
                assert line, f"the server exited: {lines}"
                lines.append(line)
        match = re.search(r"http://127\.0\.0\.1:\d+/", lines[0])
        assert match, lines[0]
        yield match.group(0), lines
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            out, _ = proc.communicate(timeout=30)
            pytest.fail("the server did not stop within 60 s of SIGINT:\n" + "".join(lines) + out)
        lines += out.splitlines()
    assert proc.returncode == 0, lines


def progress(b: Browser) -> str:
    return str(b.js("document.getElementById('progress').textContent"))


def wait_progress(b: Browser, text: str) -> None:
    b.wait_for(f"document.getElementById('progress').textContent === {json.dumps(text)}")


def test_label_by_clicks_and_keys_then_stop_and_resume(tmp_path: Path) -> None:
    source = make_eval_dir(tmp_path / "eval")
    found = find_samples(source)
    with Browser(tmp_path / "profile") as b:
        with review_server(str(source), "--reviewer", "ann", "--seed", "5") as (url, _):
            order = LabelStore.open(found, []).order(found.samples)
            b.goto(url)
            wait_progress(b, "sample 1 of 12 · 0 labelled")
            assert b.js("document.getElementById('answer').textContent") == order[0].completion
            # Blind: neither the model nor any score is on the page.
            body = str(b.js("document.body.innerText"))
            assert "trained" not in body and "base" not in body and "xml_format" not in body

            # Sample 1 with the mouse, and a note typed after the E key.
            b.click("grade-0-yes")
            b.click("grade-1-no")
            b.press("e")
            b.type_text("too vague")
            b.press("Escape")
            b.click("save")
            wait_progress(b, "sample 2 of 12 · 1 labelled")
            # Sample 2 with keys only: Y (price, then on to customer), Y, Enter.
            b.press("y")
            b.press("y")
            b.press("Enter")
            wait_progress(b, "sample 3 of 12 · 2 labelled")
            # Sample 3: Enter before every item is graded saves nothing.
            b.press("n")
            b.press("Enter")
            b.wait_for("document.getElementById('status').textContent.includes('grade every')")
            assert progress(b) == "sample 3 of 12 · 2 labelled"
            b.press("n")
            b.press("ArrowUp")  # back to the first item, and change it
            b.press("y")
            b.press("Enter")
            wait_progress(b, "sample 4 of 12 · 3 labelled")

            store = LabelStore.open(found, [])
            saved = {lab.sample_id: lab for lab in store.labels("ann")}
            assert len(saved) == 3
            first, second, third = (saved[s.id] for s in order[:3])
            assert first.grades == {"price": 1, "customer": 0} and first.note == "too vague"
            assert second.grades == {"price": 1, "customer": 1} and second.score == 1.0
            assert third.grades == {"price": 1, "customer": 0} and third.note == ""

            # The hostile sample, reached with the skip key, shows as text and runs nothing.
            hostile = next(i for i, s in enumerate(order) if s.completion == HOSTILE)
            for _ in range(3, hostile):
                b.press("ArrowRight")
            if hostile >= 3:
                wait_progress(b, f"sample {hostile + 1} of 12 · 3 labelled")
            else:
                for _ in range(hostile, 3):
                    b.press("ArrowLeft")
                wait_progress(b, f"sample {hostile + 1} of 12 · 3 labelled")
            assert b.js("document.getElementById('answer').textContent") == HOSTILE
            assert b.js("document.querySelectorAll('#answer *, img, main script').length") == 0
            assert b.js("typeof window.pwned") == "undefined"
            assert b.js("document.getElementById('prompt').textContent").endswith("<b>bold</b>")
            assert b.problems() == []

        # Stopped (SIGINT); a new server on another port resumes at the first unlabelled sample.
        with review_server(str(source), "--reviewer", "ann") as (url, _):
            b.goto(url)
            wait_progress(b, "sample 4 of 12 · 3 labelled")
            assert b.js("document.getElementById('answer').textContent") == order[3].completion
            b.press("ArrowLeft")  # the label given before the stop is shown again
            wait_progress(b, "sample 3 of 12 · 3 labelled")
            b.wait_for("document.getElementById('grade-0-yes').classList.contains('chosen')")
            assert b.js("document.getElementById('grade-1-no').classList.contains('chosen')")
            assert b.problems() == []
    # A second reviewer starts from the beginning; the first one's labels stay theirs.
    from grpokit.evaluate.review_server import ReviewApp

    bob = ReviewApp(LabelStore.open(found, []), found.samples, "bob").state()
    assert bob["resume"] == 0 and bob["labelled"] == 0


def test_one_score_review_of_a_generate_file(tmp_path: Path) -> None:
    gen = make_generate_file(tmp_path / "gen" / "samples.jsonl")
    with Browser(tmp_path / "profile") as b:
        with review_server(str(gen), "--reviewer", "ann", "--seed", "1") as (url, lines):
            b.goto(url)
            wait_progress(b, "sample 1 of 4 · 0 labelled")
            b.press("4")
            b.press("Enter")
            wait_progress(b, "sample 2 of 4 · 1 labelled")
            b.click("score-2")
            b.click("save")
            wait_progress(b, "sample 3 of 4 · 2 labelled")
            assert b.problems() == []
        assert "one 1-5 score" in lines[0]
    found = find_samples(gen)
    store = LabelStore.open(found, [])
    order = store.order(found.samples)
    scores = {lab.sample_id: lab.score for lab in store.labels("ann")}
    assert scores == {order[0].id: 0.75, order[1].id: 0.25}
    assert any("stopped; 2 label(s) by ann" in line for line in lines)
