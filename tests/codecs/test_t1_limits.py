"""T1 expansion is held to max_output_bytes while it expands (issue 11.10), and the accounting that
does it is exact, so a message whose expansion fits is never refused."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any, Literal

import msgspec
import pytest
from hypothesis import example, given

from m2mwire.codecs import t1
from m2mwire.codecs.jsonutil import dumps_compact
from m2mwire.codecs.limits import Limits
from m2mwire.codecs.t1 import decode_t1, encode_t1
from m2mwire.errors import LimitExceeded
from tests.codecs.test_jsonutil import SETTINGS
from tests.codecs.test_t1 import any_json


def _utf8(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _counted_growth(obj: Any) -> int:
    """Output size as the budget counts it, starting from the exact compact size of ``obj``."""
    budgets: list[t1._Budget] = []

    def fresh(_dialect: str) -> t1._Budget:
        budgets.append(t1._Budget(1 << 40, None, len(msgspec.json.encode(obj))))
        return budgets[-1]

    t1._expand_auto(obj, fresh)
    return (1 << 40) - budgets[-1].left


@SETTINGS
@given(any_json)
# Found by this test: a reference wire read as seed, whose repeated keys ("" and "~") shrink the
# output only after an earlier object has grown it.
@example([{"content": False}, {"~": False, "": False}])
@example({"u": {"content": False}, "~": [], "": []})
def test_growth_is_counted_exactly_in_both_dialects(x: Any) -> None:
    dialects: tuple[Literal["seed", "reference"], ...] = ("seed", "reference")
    for dialect in dialects:
        wire = encode_t1(dumps_compact(x), dialect=dialect)
        out = decode_t1(wire)
        assert _counted_growth(msgspec.json.decode(wire[4:])) == _utf8(out)
        # the limit at exactly the output's size passes; one byte less does not
        assert decode_t1(wire, limits=Limits(max_output_bytes=_utf8(out))) == out
        with pytest.raises(LimitExceeded):
            decode_t1(wire, limits=Limits(max_output_bytes=_utf8(out) - 1))


def test_a_spaced_wire_is_credited_its_compact_size() -> None:
    # The budget starts from the wire's size; whitespace makes that more than the compact size,
    # which is measured when the first estimate runs out, so the exact limit still passes.
    value = {"messages": [{"role": "user", "content": "hi"}] * 50, "model": "gpt-4o"}
    wire = "#T1|" + json.dumps(msgspec.json.decode(encode_t1(json.dumps(value))[4:]), indent=4)
    out = decode_t1(wire)
    assert len(wire) > _utf8(out)
    assert decode_t1(wire, limits=Limits(max_output_bytes=_utf8(out))) == out


def test_an_expansion_bomb_stops_while_expanding() -> None:
    # 100,000 reference-dialect objects {"M":"g4o"}: 1.2 MB that expand to 11 MB of JSON (and a
    # tree of 100,000 seven-member dicts). Refused once 2 MiB of output is certain, not after.
    row = "[" + ",".join(['{"M":"g4o"}'] * 10_000) + "]"
    wire = "#T1|[" + ",".join([row] * 10) + "]"
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        parsed = msgspec.json.decode(wire[4:])
        parse_cost = tracemalloc.get_traced_memory()[0] - before
        del parsed
        tracemalloc.reset_peak()
        with pytest.raises(LimitExceeded, match="while expanding"):
            decode_t1(wire, limits=Limits(max_output_bytes=2 << 20))
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak < 2 * parse_cost, f"peak {peak} for a parse of {parse_cost}"
