"""A headless Chromium driven over the Chrome DevTools Protocol, standard library only.

Chromium's ``--remote-debugging-pipe`` reads protocol commands from file descriptor 3 and writes
replies and events to descriptor 4, each message a JSON text ended by a NUL byte: no websocket,
no port, no package. Clicks and key presses go through ``Input.dispatchMouseEvent`` and
``Input.dispatchKeyEvent``, which the page receives as trusted user input.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# key -> (code, Windows virtual key code, text typed)
_KEYS: dict[str, tuple[str, int, str]] = {
    "Enter": ("Enter", 13, "\r"),
    "Escape": ("Escape", 27, ""),
    "ArrowLeft": ("ArrowLeft", 37, ""),
    "ArrowUp": ("ArrowUp", 38, ""),
    "ArrowRight": ("ArrowRight", 39, ""),
    "ArrowDown": ("ArrowDown", 40, ""),
}


class Browser:
    """One headless Chromium with one page; ``close`` (or ``with``) ends it."""

    def __init__(self, profile: Path) -> None:
        assert CHROMIUM is not None
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # Moved above the descriptors the child is given (F_DUPFD takes the lowest free one from
        # 10), so that placing them at 3 and 4 in the child clobbers neither.
        high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
        high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def place_pipes() -> None:  # in the child, before exec
            os.dup2(high_r, 3)  # dup2 leaves the copies inheritable
            os.dup2(high_w, 4)
            os.close(high_r)
            os.close(high_w)

        cmd = [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--remote-debugging-pipe", f"--user-data-dir={profile}", "--window-size=1200,900",
            "about:blank",
        ]  # fmt: skip
        # close_fds=False: the child keeps only inheritable descriptors (Python creates its own
        # as non-inheritable), which are 0-2 and the two pipes placed at 3 and 4.
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=place_pipes,
            close_fds=False,
        )
        os.close(high_r)
        os.close(high_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for fd in (self._to_child, self._from_child):
            with contextlib.suppress(OSError):
                os.close(fd)

    # ---- the protocol -----------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from Chromium")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed its debugging pipe")
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        out: dict[str, Any] = json.loads(message)
        return out

    def call(self, method: str, *, session: bool = False, timeout: float = 60.0,
             **params: Any) -> dict[str, Any]:  # fmt: skip
        """Send one command and return its result; events met meanwhile go to ``events``."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            if "method" in reply:
                self.events.append(reply)

    # ---- the page -----------------------------------------------------------------------------

    def goto(self, url: str) -> None:
        self.call("Page.navigate", session=True, url=url)

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        result = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True,
            awaitPromise=True,
        )  # fmt: skip
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0) -> Any:
        """Poll until the expression is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.js(expression)
            except RuntimeError:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout} s: {expression}")
            time.sleep(0.1)

    def click(self, element_id: str) -> None:
        """A left click at the middle of the element, as a mouse would."""
        box = self.wait_for(
            f"(() => {{ const e = document.getElementById({json.dumps(element_id)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return r.width > 0 ? [r.x + r.width / 2, r.y + r.height / 2] : null; })()"
        )
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y, button="left",
                clickCount=1,
            )  # fmt: skip

    def press(self, key: str) -> None:
        """One key press: a named key (Enter, Escape, arrows) or one printable character."""
        if key in _KEYS:
            code, vk, text = _KEYS[key]
        else:
            code = f"Key{key.upper()}" if key.isalpha() else f"Digit{key}" if key.isdigit() else ""
            vk, text = ord(key.upper()), key
        down: dict[str, Any] = {"key": key, "code": code, "windowsVirtualKeyCode": vk}
        if text:
            down["text"] = text
        self.call("Input.dispatchKeyEvent", session=True, type="keyDown", **down)
        self.call("Input.dispatchKeyEvent", session=True, type="keyUp", key=key, code=code,
                  windowsVirtualKeyCode=vk)  # fmt: skip

    def type_text(self, text: str) -> None:
        for ch in text:
            self.press(ch)

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log entries (CSP violations among
        them) seen so far."""
        self.js("0")  # collect the events that arrived since the last command
        out = []
        for e in self.events:
            method, params = e["method"], e.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(str(params.get("exceptionDetails")))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in (
                "error",
                "warning",
            ):
                out.append(str(params.get("args")))
            elif method == "Log.entryAdded" and params["entry"].get("level") in (
                "error",
                "warning",
            ):
                out.append(str(params["entry"].get("text")))
        return out
