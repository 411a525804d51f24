"""Message is fully typed: a received JSON value is a JSON union, not Any (issue 17)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from mypy import api as mypy_api


def test_mypy_makes_the_user_narrow_a_json_value_before_using_it(tmp_path: Path) -> None:
    source = tmp_path / "user_code.py"
    source.write_text(
        textwrap.dedent(
            """
            import m2mwire
            from m2mwire import JsonValue

            def use(message: m2mwire.Message) -> JsonValue:
                count: int = message.value
                first = message.value["items"]
                if isinstance(message.value, dict):
                    return message.value.get("items")
                kind: str = message.kind
                size: int = message.wire_bytes + message.original_bytes
                untyped: JsonValue = message.json()["anything"]
                return untyped
            """
        )
    )
    out, _err, status = mypy_api.run(
        ["--strict", "--cache-dir", str(tmp_path / "cache"), "--no-error-summary", str(source)]
    )
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert status == 1
    assert any(":6:" in e for e in errors), out  # JsonValue is not an int
    assert any(":7:" in e for e in errors), out  # not indexable before narrowing
    # narrowed, the other typed fields, and json() (the untyped escape hatch) all check
    assert not any(f":{n}:" in e for n in (9, 10, 11, 12, 13) for e in errors), out
