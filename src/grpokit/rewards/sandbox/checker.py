"""The test checker of :mod:`grpokit.rewards.sandbox`: runs a row's test code, never the solution.

Run as ``python -I -S -X utf8 checker.py`` with its configuration (the test code
included) as JSON on stdin; it imports only the standard library. The test code runs here, as it
is written (``assert f(x) == y``, loops, helpers, ``def check(candidate): ...; check(f)``, ``with``
blocks, ``math.isclose`` ...). A name it uses but does not define is the solution's: looking it
up, calling it, reading an attribute or iterating over a result sends a request to the sandboxed
process, which answers with plain data (:mod:`~grpokit.rewards.sandbox.wire`). So every comparison, ``bool()``,
``hash()`` and ``isinstance()`` of the tests runs on built-in objects made here; an object of the
solution's that is not plain data stays a :class:`SolutionObject` that equals only itself.

The verdict goes to the parent on its own pipe, which the sandboxed process never holds:
``{"passed": true}`` when the test code ran to its end, else the reason. ``unsupported`` marks a
test that hands the solution something that is not data (a function, an instance of a class of
its own): the parent reports that row to the user.
"""

from __future__ import annotations

import builtins
import importlib
import json
import os
import sys

TYPE_CHECKING = False  # no `typing` at run time: start-up time counts per test case
if TYPE_CHECKING:
    from typing import Any

    from grpokit.rewards.sandbox.wire import (
        MessageReader,
        WireError,
        decode,
        encode,
        write_message,
    )
else:  # run as a script, outside the package (and without site-packages)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from wire import MessageReader, WireError, decode, encode, write_message

    del sys.path[0]

# The built-in exceptions a solution's call may raise here, so that `except ValueError` works.
# Not StopIteration: raised from a call inside `map()` or `filter()` it would end the iteration
# early (`all(map(check, cases))` would be True).
_EXCEPTIONS = {
    name: value
    for name, value in vars(builtins).items()
    if isinstance(value, type)
    and issubclass(value, Exception)
    and not issubclass(value, (StopIteration, StopAsyncIteration))
}
# Standard modules the checker imports itself when the tests use one the solution imported (e.g.
# `math.isclose(...)` without `import math`): the check must not run the solution's copy, which
# it may have changed. Pure computation only: importing them has no side effect.
_TRUSTED_MODULES = frozenset(
    [
        "array",
        "bisect",
        "calendar",
        "cmath",
        "collections",
        "copy",
        "datetime",
        "decimal",
        "fractions",
        "functools",
        "heapq",
        "itertools",
        "json",
        "math",
        "numbers",
        "operator",
        "random",
        "re",
        "statistics",
        "string",
        "textwrap",
        "typing",
        "unicodedata",
    ]
)


class SolutionError(Exception):
    """The solution raised an exception that is not a built-in one (its type name is kept)."""


class SolutionGone(BaseException):
    """The sandboxed process stopped answering or broke the protocol: the case fails.

    A BaseException so that a test's ``except Exception`` cannot take it for an answer.
    """


class Unsupported(BaseException):
    """The test passes the solution something that cannot cross as data."""


class SolutionObject:
    """An object of the solution's: callable, its attributes readable, iterable; equal to itself."""

    __slots__ = ("_sandbox_link", "_sandbox_handle")

    def __init__(self, link: SolutionLink, handle: int) -> None:
        self._sandbox_link = link
        self._sandbox_handle = handle

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._sandbox_link.request(
            {
                "op": "call",
                "target": self._sandbox_handle,
                "args": self._sandbox_link.encode(list(args)),
                "kwargs": {"dict": [[k, self._sandbox_link.encode(v)] for k, v in kwargs.items()]},
            }
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # protocols (copy, pickle ...) are not forwarded
        return self._sandbox_link.request(
            {"op": "getattr", "target": self._sandbox_handle, "name": name}
        )

    def __iter__(self) -> Any:
        return iter(self._sandbox_link.request({"op": "iterate", "target": self._sandbox_handle}))

    def __repr__(self) -> str:
        return f"<solution object #{self._sandbox_handle}>"


class SolutionLink:
    """Requests to the sandboxed process and their plain-data answers."""

    def __init__(self, request_fd: int, reader: MessageReader) -> None:
        self.request_fd = request_fd
        self.reader = reader
        self.objects: dict[int, SolutionObject] = {}
        self.module_handles: dict[str, int] = {}  # trusted modules standing for the solution's

    def receive(self) -> dict[str, Any]:
        try:
            return self.reader.read()
        except WireError as exc:
            raise SolutionGone(f"the solution stopped answering ({exc})") from None

    def request(self, message: dict[str, Any]) -> Any:
        try:
            write_message(self.request_fd, message)
        except OSError as exc:
            raise SolutionGone(f"the solution stopped answering ({exc})") from None
        reply = self.receive()
        if set(reply) == {"value"}:
            try:
                return decode(reply["value"], self._object, self._module)
            except (WireError, RecursionError) as exc:
                raise SolutionGone(f"an answer that is not plain data ({exc})") from None
        raised = reply.get("raised")
        if set(reply) == {"raised"} and type(raised) is list and len(raised) == 2:
            name, text = raised
            if type(name) is str and type(text) is str:
                raise _solution_exception(name, text)
        raise SolutionGone("a reply that is not of the protocol")

    def encode(self, value: Any) -> Any:
        return encode(value, self._handle_of)

    def _handle_of(self, value: Any) -> int:
        if type(value) is SolutionObject:
            return value._sandbox_handle
        if type(value) is type(os) and value.__name__ in self.module_handles:
            return self.module_handles[value.__name__]
        raise Unsupported(
            f"the test passes a {type(value).__name__} to the solution; only data (None, bool, "
            "int, float, str, bytes, complex, list, tuple, dict, set, frozenset, range) and "
            "objects the solution returned can be passed"
        )

    def _module(self, name: str, handle: int) -> Any:
        if name.partition(".")[0] not in _TRUSTED_MODULES:
            return self._object(handle)
        try:
            module = importlib.import_module(name)
        except ImportError:
            return self._object(handle)
        self.module_handles[name] = handle
        return module

    def _object(self, handle: int) -> SolutionObject:
        if handle not in self.objects:
            self.objects[handle] = SolutionObject(self, handle)
        return self.objects[handle]


def _solution_exception(name: str, text: str) -> Exception:
    """The built-in exception the solution raised (so ``except ValueError`` works), else a
    :class:`SolutionError`; never a BaseException such as SystemExit."""
    kind = _EXCEPTIONS.get(name)
    if kind is not None:
        try:
            return kind(text)
        except Exception:  # noqa: BLE001  (UnicodeDecodeError and others want more arguments)
            pass
    return SolutionError(f"{name}: {text}")


# A plain `dict` base: `dict[str, Any]` would need `typing` at run time.
class SolutionNames(dict):  # type: ignore[type-arg]
    """The test code's builtins: a name it neither defines nor finds in Python's builtins is
    looked up in the solution's namespace (once)."""

    def __init__(self, link: SolutionLink) -> None:
        super().__init__(vars(builtins))
        self.link = link

    def __missing__(self, name: str) -> Any:
        value = self.link.request({"op": "global", "name": name})
        self[name] = value
        return value


def _deny_inspection() -> None:
    """Mark this process non-dumpable: its memory and /proc files need CAP_SYS_PTRACE."""
    import ctypes

    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    sys.modules.pop("ctypes", None)


def _limits(config: dict[str, Any]) -> None:
    import resource

    for which, value in (
        (resource.RLIMIT_CPU, config["cpu_s"]),
        (resource.RLIMIT_AS, config["memory_bytes"]),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(which, (value, value))


def check(tests: str, link: SolutionLink) -> dict[str, Any]:
    """Run ``tests`` against the solution behind ``link``; the verdict."""
    try:
        ready = link.receive()
        if ready != {"ready": True}:
            return {"passed": False, "detail": "the solution did not load"}
        namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": SolutionNames(link)}
        exec(compile(tests, "tests.py", "exec"), namespace)
    except Unsupported as exc:
        return {"passed": False, "unsupported": str(exc)}
    except SystemExit as exc:
        if exc.code in (None, 0):
            return {"passed": True}
        return {"passed": False, "detail": f"the tests exited with {exc.code!r}"}
    except BaseException as exc:  # noqa: BLE001  (a failed assertion, an error, a broken link)
        return {"passed": False, "detail": f"{type(exc).__name__}: {exc}"[:2000]}
    return {"passed": True}


def main() -> None:
    config = json.loads(sys.stdin.read())
    sys.set_int_max_str_digits(0)  # answers may be integers of any size
    _deny_inspection()
    _limits(config)
    link = SolutionLink(
        config["request_fd"], MessageReader(config["reply_fd"], config["max_message_bytes"])
    )
    verdict = check(config["tests"], link)
    sys.stdout.flush()
    write_message(config["verdict_fd"], verdict)
    os._exit(0)


if __name__ == "__main__":
    main()
