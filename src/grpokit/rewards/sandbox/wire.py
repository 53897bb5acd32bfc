"""The wire between the sandboxed solution and the test checker: plain data as JSON lines.

Imported by both child processes of :mod:`grpokit.rewards.sandbox` (standard library only). A
value crosses as JSON built from exact types only: ``None``, ``bool``, ``int``, ``float``,
``str`` and lists as themselves; tuples, dicts, sets, frozensets, bytes, complex numbers and
ranges as one-key objects (``{"tuple": [...]}``, ``{"dict": [[key, value], ...]}`` ...); a
module as ``{"module": [name, n]}`` (the checker uses its own copy of a standard module it
trusts); anything else as ``{"handle": n}``, a number the solution's side keeps for the object.
:func:`decode` accepts nothing but that grammar and builds fresh built-in objects, so no class
or method of the solution's ever exists on the checker's side, whatever bytes the solution writes.
"""

from __future__ import annotations

import binascii
import json
import os

# Both child processes import this module at start: no `typing` at run time (tens of ms).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


_MODULE = type(os)


class WireError(Exception):
    """A message that is not of the grammar, or a stream that ended or overflowed."""


def encode(value: Any, handle_of: Callable[[Any], int]) -> Any:
    """``value`` as JSON-ready data; ``handle_of`` numbers any object that is not plain data.

    Exact ``type(x) is ...`` checks: a subclass of ``int`` or ``list`` is not plain data (its
    methods could say anything), it travels as a handle.
    """
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is float or kind is str:
        return value
    if kind is list:
        return [encode(item, handle_of) for item in value]
    if kind is tuple:
        return {"tuple": [encode(item, handle_of) for item in value]}
    if kind is dict:
        return {"dict": [[encode(k, handle_of), encode(v, handle_of)] for k, v in value.items()]}
    if kind is set or kind is frozenset:
        return {kind.__name__: [encode(item, handle_of) for item in value]}
    if kind is bytes:
        return {"bytes": binascii.b2a_base64(value, newline=False).decode("ascii")}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    if kind is range:
        return {"range": [value.start, value.stop, value.step]}
    if kind is _MODULE and type(value.__dict__.get("__name__")) is str:
        return {"module": [value.__dict__["__name__"], handle_of(value)]}
    return {"handle": handle_of(value)}


def decode(
    data: Any,
    object_for: Callable[[int], Any],
    module_for: Callable[[str, int], Any] | None = None,
) -> Any:
    """The value ``data`` stands for; handles become ``object_for(n)``, modules
    ``module_for(name, n)`` (by default ``object_for(n)``).

    Raises:
        WireError: ``data`` is not of the grammar (or holds an unhashable set member / dict key).
    """
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is float or kind is str:
        return data
    if kind is list:
        return [decode(item, object_for, module_for) for item in data]
    if kind is not dict or len(data) != 1:
        raise WireError(f"not a value: {str(data)[:80]}")
    ((tag, body),) = data.items()
    try:
        if tag == "handle" and type(body) is int:
            return object_for(body)
        if tag == "module" and type(body) is list and len(body) == 2:
            name, number = body
            if type(name) is str and type(number) is int:
                return module_for(name, number) if module_for else object_for(number)
        if tag == "bytes" and type(body) is str:
            return binascii.a2b_base64(body.encode("ascii"), strict_mode=True)
        if tag == "complex" and type(body) is list and len(body) == 2:
            real, imag = body
            if type(real) in (int, float) and type(imag) in (int, float):
                return complex(real, imag)
        if tag == "range" and type(body) is list and all(type(n) is int for n in body):
            return range(*body)
        if type(body) is list:
            items = [decode(item, object_for, module_for) for item in body]
            if tag == "tuple":
                return tuple(items)
            if tag == "set":
                return set(items)
            if tag == "frozenset":
                return frozenset(items)
            if tag == "dict" and all(type(p) is list and len(p) == 2 for p in items):
                return {k: v for k, v in items}
    except (TypeError, ValueError, OverflowError, binascii.Error) as exc:
        raise WireError(f"bad {tag}: {exc}") from None
    raise WireError(f"not a value: {str(data)[:80]}")


def write_message(fd: int, message: dict[str, Any]) -> None:
    """Send one message as one line (json.dumps never writes a raw newline)."""
    data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class MessageReader:
    """Reads line-framed messages from a descriptor, none longer than ``max_bytes``."""

    def __init__(self, fd: int, max_bytes: int) -> None:
        self.fd = fd
        self.max_bytes = max_bytes
        self._buffer = b""

    def read(self) -> dict[str, Any]:
        """The next message.

        Raises:
            WireError: end of stream, a line over the limit, or not a JSON object.
        """
        while b"\n" not in self._buffer:
            if len(self._buffer) > self.max_bytes:
                raise WireError(f"a message over {self.max_bytes} bytes")
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise WireError("the other side closed the stream")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        if len(line) > self.max_bytes:
            raise WireError(f"a message over {self.max_bytes} bytes")
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise WireError(f"not JSON: {exc}") from None
        if type(message) is not dict:
            raise WireError("a message must be a JSON object")
        return message
