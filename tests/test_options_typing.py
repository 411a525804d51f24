"""connect() and serve() options are typed: a checker catches a misspelt or misplaced option."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import get_args

from mypy import api as mypy_api

from m2mwire.options import Call, ConnectOptions, Scheme, ServeOptions, SessionOptions, valid_options


def _accepted(call: Call) -> set[str]:
    return {name for scheme in get_args(Scheme) for name in valid_options(call, scheme)}


def test_typed_options_are_exactly_the_options_accepted_at_run_time() -> None:
    # The TypedDicts and the run-time tables must not drift apart: a key missing here would make
    # a checker refuse a valid option, an extra one would let a wrong one through to run time.
    assert set(ConnectOptions.__annotations__) | _session_keys() == _accepted("connect")
    assert set(ServeOptions.__annotations__) | _session_keys() == _accepted("serve")


def _session_keys() -> set[str]:
    return set(SessionOptions.__annotations__)


def test_mypy_reports_a_misspelt_and_a_misplaced_option(tmp_path: Path) -> None:
    source = tmp_path / "user_code.py"
    source.write_text(
        textwrap.dedent(
            """
            import m2mwire

            async def handler(session: m2mwire.Session) -> None:
                pass

            async def main() -> None:
                async with m2mwire.connect("ws://127.0.0.1:1", max_payloda=5):
                    pass
                m2mwire.serve(handler, "ws://127.0.0.1:0", fingerprint="ab")
                m2mwire.serve(handler, "ws://127.0.0.1:0", max_payload=1024, on_hello=None)
            """
        )
    )
    out, _err, status = mypy_api.run(
        ["--strict", "--cache-dir", str(tmp_path / "cache"), "--no-error-summary", str(source)]
    )
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert status == 1
    assert any(":8:" in e and '"max_payloda"' in e for e in errors), out
    assert any(":10:" in e and '"fingerprint"' in e for e in errors), out
    assert not any(":11:" in e for e in errors), out  # valid options pass
