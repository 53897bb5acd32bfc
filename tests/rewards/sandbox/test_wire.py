"""The plain-data wire between the sandboxed solution and the checker."""

from __future__ import annotations

import json
import math
import os

import pytest

from grpokit.rewards.sandbox.wire import MessageReader, WireError, decode, encode, write_message


def _round_trip(value: object) -> object:
    handles: list[object] = []

    def handle_of(obj: object) -> int:
        handles.append(obj)
        return len(handles) - 1

    data = json.loads(json.dumps(encode(value, handle_of)))
    return decode(data, lambda n: ("handle", n))


def test_plain_values_cross_exactly() -> None:
    value = [
        None,
        True,
        0,
        -(10**30),
        1.5,
        "é\udcff",
        (1, [2]),
        {(1, "a"): {"b": b"\x00\xff"}},
        {1, 2},
        frozenset({3}),
        1 + 2j,
        range(1, 9, 3),
    ]
    back = _round_trip(value)
    assert back == value
    assert [type(v) for v in back] == [type(v) for v in value]  # type: ignore[attr-defined]
    assert math.isnan(_round_trip(float("nan")))  # type: ignore[arg-type]


def test_anything_else_is_a_handle() -> None:
    class Rigged(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    assert _round_trip([Rigged(1), print, iter([])]) == [
        ("handle", 0),
        ("handle", 1),
        ("handle", 2),
    ]


@pytest.mark.parametrize(
    "data",
    [
        {"__class__": "x"},
        {"tuple": [1], "list": []},
        {"tuple": "ab"},
        {"handle": "0"},
        {"handle": True},
        {"set": [[1]]},
        {"dict": [[1]]},
        {"dict": [[[1], 2]]},
        {"bytes": "not base64!"},
        {"complex": ["1", 2]},
        {"range": [1, 2, 0]},
        {"range": [1.5]},
    ],
)
def test_decode_accepts_only_the_grammar(data: object) -> None:
    with pytest.raises(WireError):
        decode(data, lambda n: n)


def test_messages_are_framed_and_capped() -> None:
    read, write = os.pipe()
    try:
        write_message(write, {"value": [1, "x\ny"]})
        os.write(write, b"[1]\n" + b"7" * 100 + b"\n")
        os.close(write)
        reader = MessageReader(read, max_bytes=50)
        assert reader.read() == {"value": [1, "x\ny"]}
        with pytest.raises(WireError, match="JSON object"):
            reader.read()
        with pytest.raises(WireError, match="over 50 bytes"):
            reader.read()
    finally:
        os.close(read)
