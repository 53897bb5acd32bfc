"""The review page: a local web server (standard library) that shows samples blind and records
a person's grades.

It binds 127.0.0.1 only, answers requests whose Host is that address (or localhost) at its own
port, and takes labels only as JSON posted by its own page. Every text from the samples reaches
the page as JSON and is put in place with ``textContent``, never parsed as HTML; the page's
Content-Security-Policy allows only its own script and style files, so markup in a completion
can neither render nor run.
"""

from __future__ import annotations

import errno
import json
import signal
import threading
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from grpokit.errors import UserError
from grpokit.evaluate.review_data import SCORE_LEVELS, LabelStore, ReviewSample

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>grpokit review</title><link rel="stylesheet" href="/review.css"></head>
<body>
<header><b>grpokit review</b> <span id="progress"></span> <span id="reviewer"></span></header>
<main id="main" hidden>
<h2>Request</h2><pre id="prompt"></pre>
<h2>Answer</h2><pre id="answer"></pre>
<section id="grading"></section>
<label for="note">Note (E to write, Esc to leave)</label>
<textarea id="note" rows="3"></textarea>
<div class="buttons">
<button id="prev" type="button">&larr; previous</button>
<button id="save" type="button">save and next (Enter)</button>
<button id="next" type="button">skip &rarr;</button>
</div>
<p id="status" role="status"></p>
</main>
<p id="done" hidden>Every sample is labelled. Go back with &larr; to change a label, or
stop the server (Ctrl-C) and run <code>grpokit review DIR --report</code>.</p>
<footer id="keys"></footer>
<script src="/review.js"></script>
</body></html>
"""

STYLE = """
body { font: 15px/1.5 system-ui, sans-serif; max-width: 980px; margin: 0 auto; padding: 0 16px;
       color: #222; }
header { padding: 10px 0; border-bottom: 1px solid #ddd; }
h2 { font-size: 15px; margin: 14px 0 4px; color: #555; }
pre { background: #f6f6f6; padding: 10px; white-space: pre-wrap; word-break: break-word;
      margin: 0; max-height: 40vh; overflow: auto; }
.item { display: flex; gap: 10px; align-items: center; padding: 5px 8px; margin: 3px 0;
        border: 2px solid transparent; border-radius: 4px; }
.item.current { border-color: #4a7bd0; background: #f2f6ff; }
.item .text { flex: 1; white-space: pre-wrap; }
button { font: inherit; padding: 4px 12px; cursor: pointer; }
button.chosen { background: #2c6b2f; color: #fff; }
button.no.chosen { background: #a32b2b; }
textarea { width: 100%; font: inherit; box-sizing: border-box; }
.buttons { display: flex; gap: 8px; margin: 10px 0; }
#status { min-height: 1.5em; color: #555; }
footer { color: #777; font-size: 13px; border-top: 1px solid #ddd; margin-top: 16px;
         padding: 8px 0; }
"""

SCRIPT = r"""
"use strict";
const $ = (id) => document.getElementById(id);
let state = null, pos = 0, sample = null, grades = {}, score = null, current = 0;

async function api(path, body) {
  const opts = body === undefined ? {} : {method: "POST", body: JSON.stringify(body),
    headers: {"Content-Type": "application/json"}};
  const res = await fetch(path, opts);
  const data = await res.json();
  if (!res.ok) throw new Error(data.error || res.statusText);
  return data;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function render() {
  const box = $("grading");
  box.replaceChildren();
  if (state.mode === "checklist") {
    state.items.forEach((item, i) => {
      const row = el("div", "item" + (i === current ? " current" : ""));
      row.id = "item-" + i;
      row.append(el("span", "key", String(i + 1)), el("span", "text", item.text));
      for (const [value, word] of [[1, "yes"], [0, "no"]]) {
        const b = el("button", word + (grades[item.name] === value ? " chosen" : ""), word);
        b.type = "button";
        b.id = "grade-" + i + "-" + word;
        b.addEventListener("click", () => { current = i; grade(value); });
        row.append(b);
      }
      box.append(row);
    });
  } else {
    const row = el("div", "item current");
    row.append(el("span", "text", "Overall quality, 1 (bad) to " + state.levels + " (good)"));
    for (let k = 1; k <= state.levels; k++) {
      const b = el("button", score === k ? "chosen" : "", String(k));
      b.type = "button";
      b.id = "score-" + k;
      b.addEventListener("click", () => { score = k; render(); });
      row.append(b);
    }
    box.append(row);
  }
  $("progress").textContent = "sample " + (pos + 1) + " of " + state.total + " · " +
    state.labelled + " labelled";
}

function grade(value) {
  grades[state.items[current].name] = value;
  if (current < state.items.length - 1) current += 1;
  render();
}

function complete() {
  return state.mode === "checklist"
    ? state.items.every((item) => grades[item.name] === 0 || grades[item.name] === 1)
    : score !== null;
}

// Each navigation takes a ticket; only the latest one's reply is shown, so quick key presses
// whose replies come back out of order never pair one sample's text with another's position.
let navigation = 0, shown = 0;

async function show(p) {
  const ticket = ++navigation;
  pos = Math.min(Math.max(0, p), state.total);
  if (pos >= state.total) {
    shown = ticket; $("main").hidden = true; $("done").hidden = false; return;
  }
  const data = await api("/api/sample/" + pos);
  if (ticket !== navigation) return;
  shown = ticket;
  sample = data;
  $("main").hidden = false; $("done").hidden = true;
  $("prompt").textContent = sample.prompt;
  $("answer").textContent = sample.completion;
  const label = sample.label;
  grades = label ? Object.assign({}, label.grades) : {};
  score = label && label.level !== null ? label.level : null;
  $("note").value = label ? label.note : "";
  current = 0;
  $("status").textContent = label ? "labelled before; Enter saves any change" : "";
  render();
}

async function save() {
  if (shown !== navigation) return;  // still loading the sample the grades would go to
  if (!complete()) {
    $("status").textContent = state.mode === "checklist"
      ? "grade every item first (Y / N)" : "choose a score first (1-" + state.levels + ")";
    return;
  }
  const body = {id: sample.id, note: $("note").value};
  if (state.mode === "checklist") body.grades = grades; else body.level = score;
  const res = await api("/api/label", body);
  state.labelled = res.labelled;
  $("status").textContent = "saved";
  await show(pos + 1);
}

document.addEventListener("keydown", (e) => {
  if (!state) return;
  if (e.target === $("note")) {
    if (e.key === "Escape") { $("note").blur(); e.preventDefault(); }
    else if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); save(); }
    return;
  }
  if (e.ctrlKey || e.metaKey || e.altKey) return;
  const k = e.key;
  if (k === "ArrowLeft" || k === "p") { e.preventDefault(); show(pos - 1); return; }
  if (pos >= state.total) return;
  if (k === "Enter") { e.preventDefault(); save(); }
  else if (k === "ArrowRight") { e.preventDefault(); show(pos + 1); }
  else if (k === "e") { e.preventDefault(); $("note").focus(); }
  else if (state.mode === "checklist") {
    if (k === "y" || k === "Y") grade(1);
    else if (k === "n" || k === "N") grade(0);
    else if (k === "ArrowDown") { current = Math.min(current + 1, state.items.length - 1); render(); }
    else if (k === "ArrowUp") { current = Math.max(current - 1, 0); render(); }
    else if (/^[1-9]$/.test(k) && Number(k) <= state.items.length) { current = Number(k) - 1; render(); }
  } else if (/^[1-9]$/.test(k) && Number(k) <= state.levels) { score = Number(k); render(); }
});

$("save").addEventListener("click", save);
$("prev").addEventListener("click", () => show(pos - 1));
$("next").addEventListener("click", () => show(pos + 1));

(async () => {
  state = await api("/api/state");
  $("reviewer").textContent = "· reviewer " + state.reviewer;
  $("keys").textContent = state.mode === "checklist"
    ? "Keys: Y yes · N no (then the next item) · 1-9 or ↑↓ choose an item · Enter save and next" +
      " · → skip · ← or P previous · E note (Ctrl+Enter saves from it, Esc leaves it)"
    : "Keys: 1-" + state.levels + " score · Enter save and next · → skip · ← or P previous" +
      " · E note (Ctrl+Enter saves from it, Esc leaves it)";
  await show(state.resume);
})().catch((err) => { $("status").textContent = "error: " + err.message; });
"""


class ReviewApp:
    """What the handler serves: the samples in review order, one reviewer, the label store."""

    def __init__(self, store: LabelStore, samples: Sequence[ReviewSample], reviewer: str) -> None:
        self.store = store
        self.reviewer = reviewer
        self.samples = store.order(samples)
        self.by_id = {s.id: s for s in self.samples}

    def _mine(self) -> dict[str, Any]:
        return {label.sample_id: label for label in self.store.labels(self.reviewer)}

    def state(self) -> dict[str, Any]:
        mine = self._mine()
        resume = next(
            (i for i, s in enumerate(self.samples) if s.id not in mine), len(self.samples)
        )
        return {
            "reviewer": self.reviewer,
            "mode": self.store.mode,
            "items": [{"name": i.name, "text": i.text} for i in self.store.items],
            "levels": SCORE_LEVELS,
            "total": len(self.samples),
            "labelled": sum(s.id in mine for s in self.samples),
            "resume": resume,
        }

    def sample(self, pos: int) -> dict[str, Any]:
        s = self.samples[pos]
        label = self._mine().get(s.id)
        out: dict[str, Any] = {"id": s.id, "prompt": s.prompt, "completion": s.completion}
        if label is not None:
            level = None
            if label.score is not None and not self.store.items:
                level = round(label.score * (SCORE_LEVELS - 1)) + 1
            out["label"] = {"grades": label.grades, "level": level, "note": label.note}
        return out

    def label(self, body: dict[str, Any]) -> dict[str, Any]:
        sample_id = body.get("id")
        if sample_id not in self.by_id:
            raise ValueError("unknown sample id")
        note = body.get("note", "")
        if not isinstance(note, str):
            raise ValueError("note must be text")
        grades = body.get("grades") or {}
        if not isinstance(grades, dict):
            raise ValueError("grades must be an object")
        score = None
        if not self.store.items:
            level = body.get("level")
            if not isinstance(level, int) or not 1 <= level <= SCORE_LEVELS:
                raise ValueError(f"level must be an integer 1-{SCORE_LEVELS}")
            score = (level - 1) / (SCORE_LEVELS - 1)
        self.store.save(str(sample_id), self.reviewer, grades, score, note)
        mine = self._mine()
        return {"ok": True, "labelled": sum(s.id in mine for s in self.samples)}


def _handler(app: ReviewApp) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "grpokit-review"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
            pass  # one line per request would bury the URL the command printed

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", CSP)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, data: dict[str, Any]) -> None:
            self._send(status, json.dumps(data, ensure_ascii=False).encode(),
                       "application/json; charset=utf-8")  # fmt: skip

        def _host_ok(self) -> bool:
            # A page of another site that resolves its own name to 127.0.0.1 (DNS rebinding)
            # sends its own name as Host: only this address and localhost are served.
            port = cast(ThreadingHTTPServer, self.server).server_port
            return self.headers.get("Host", "") in (f"127.0.0.1:{port}", f"localhost:{port}")

        def do_GET(self) -> None:  # noqa: N802 (the base class's name)
            if not self._host_ok():
                self._json(HTTPStatus.FORBIDDEN, {"error": "unexpected Host"})
                return
            path = self.path.split("?", 1)[0]
            if path == "/":
                self._send(HTTPStatus.OK, PAGE.encode(), "text/html; charset=utf-8")
            elif path == "/review.js":
                self._send(HTTPStatus.OK, SCRIPT.encode(), "text/javascript; charset=utf-8")
            elif path == "/review.css":
                self._send(HTTPStatus.OK, STYLE.encode(), "text/css; charset=utf-8")
            elif path == "/favicon.ico":  # browsers ask; a 404 would be logged as an error
                self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
            elif path == "/api/state":
                self._json(HTTPStatus.OK, app.state())
            elif path.startswith("/api/sample/"):
                tail = path.removeprefix("/api/sample/")
                if not tail.isdigit() or int(tail) >= len(app.samples):
                    self._json(HTTPStatus.NOT_FOUND, {"error": "no such sample"})
                else:
                    self._json(HTTPStatus.OK, app.sample(int(tail)))
            else:
                self._json(HTTPStatus.NOT_FOUND, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            if not self._host_ok():
                self._json(HTTPStatus.FORBIDDEN, {"error": "unexpected Host"})
                return
            # Another site's page cannot post JSON here without a CORS preflight, which is
            # never answered: a form post (no JSON content type) is refused.
            if self.path != "/api/label" or not self.headers.get("Content-Type", "").startswith(
                "application/json"
            ):
                self._json(HTTPStatus.NOT_FOUND, {"error": "not found"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(min(length, 1 << 20)) or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("expected a JSON object")
                self._json(HTTPStatus.OK, app.label(body))
            except ValueError as e:
                self._json(HTTPStatus.BAD_REQUEST, {"error": str(e)})

    return Handler


def make_server(app: ReviewApp, port: int = 0) -> ThreadingHTTPServer:
    """The server on 127.0.0.1:port (0: a free port); UserError when the port is taken."""
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), _handler(app))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise UserError(
                f"--port {port}: the port is in use; choose another, or leave --port out for a "
                "free one"
            ) from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise UserError(
                f"--port {port}: not allowed here (ports below 1024 need root)"
            ) from None
        raise
    server.daemon_threads = True
    return server


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def serve_until_stopped(
    server: ThreadingHTTPServer, ready: Callable[[], None] = lambda: None, poll: float = 0.2
) -> int:
    """Serve until SIGINT (Ctrl-C) or SIGTERM arrives, then stop and close; the signal's number.
    ``ready`` runs once the signals are caught (it prints the address: a signal sent as soon as
    that is read must find the handler in place).

    Both signals get a handler of their own for the time of the call, also where the process
    started with SIGINT ignored (a shell leaves it so for a command it starts in the background,
    and Python then installs no Ctrl-C handler): "stop with Ctrl-C" must stop the server
    wherever it runs. The handler only records the signal; the requests are served in a thread,
    and the main thread stops them with ``shutdown()``, which returns within the server's poll
    interval, never in the middle of a request. The handler threads are daemons that
    ``server_close`` does not wait for, so a connection a browser keeps open (kept alive or
    opened ahead of a request that never comes) cannot hold the exit up.

    Must be called from the main thread (signal handlers can only be set there).
    """
    received: list[int] = []

    def record(signum: int, _frame: object) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, record) for sig in STOP_SIGNALS}
    thread = threading.Thread(target=server.serve_forever, name="review-server", daemon=True)
    try:
        ready()
        thread.start()
        try:
            while not received and thread.is_alive():
                # A signal runs the handler during the sleep, which then sleeps on (PEP 475):
                # the loop sees the signal within ``poll`` seconds.
                time.sleep(poll)
        finally:
            server.shutdown()  # serve_forever returns within its poll interval
            thread.join()
    finally:
        server.server_close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return received[0] if received else 0
