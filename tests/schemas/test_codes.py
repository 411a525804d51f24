"""The session codes: one enum per kind, equal to docs/PROTOCOL.md's table and to the wire strings."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from m2mwire.schemas.codes import RejectCode, SessionCode
from m2mwire.schemas.messages import ClosePayload, MessageType, Rejection, encode_message

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = ROOT / "docs" / "PROTOCOL.md"
ALL_CODES = {c.value for c in RejectCode} | {c.value for c in SessionCode}


def documented_codes() -> dict[str, str]:
    """The rows of PROTOCOL.md's "### Codes" table: code -> what carries it."""
    section = PROTOCOL.read_text(encoding="utf-8").split("\n### Codes\n", 1)[1]
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]
    rows = re.findall(r"^\| `([A-Z_]+)` \| ([^|]+) \|", section, re.M)
    assert len(rows) > 20, "the Codes table of docs/PROTOCOL.md was not found"
    return {code: carried.strip() for code, carried in rows}


def test_the_enums_are_the_documented_codes() -> None:
    documented = documented_codes()
    assert set(documented) == ALL_CODES
    assert len(documented) == len(RejectCode) + len(SessionCode)  # no code in both enums
    for code in RejectCode:
        assert documented[code].startswith("REJECT"), code


def test_each_member_is_its_wire_string() -> None:
    for code in (*RejectCode, *SessionCode):
        assert code == code.name and str(code) == code.name and f"{code}" == code.name


def test_a_code_encodes_as_the_plain_string() -> None:
    as_enum = ClosePayload(reason=SessionCode.PONG_TIMEOUT, message="m")
    as_str = ClosePayload(reason="PONG_TIMEOUT", message="m")
    assert encode_message(MessageType.CLOSE, as_enum, session_id="s", timestamp=1) == encode_message(
        MessageType.CLOSE, as_str, session_id="s", timestamp=1
    )
    rejection = Rejection(code=RejectCode.RATE_LIMITED, message="m")
    assert b'"code":"RATE_LIMITED"' in encode_message(MessageType.REJECT, rejection, timestamp=1)


def test_the_session_package_spells_no_code_as_a_string() -> None:
    """Codes are named through the enums in m2mwire/session/, so a typo is an AttributeError at
    import and every code is listed (and documented) in one place."""
    spelled = []
    for path in sorted((ROOT / "m2mwire" / "session").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in ALL_CODES:
                spelled.append(f"{path.name}:{node.lineno}: {node.value!r}")
    assert spelled == []
