"""The demo's context-compression section (make demo): it shows zstd's saving on a multi-turn chat."""

from __future__ import annotations

import re

import pytest

from m2mwire.demo import _context_demo


async def test_context_demo_shows_the_saving(capsys: pytest.CaptureFixture[str]) -> None:
    await _context_demo(turns=4)
    out = capsys.readouterr().out
    assert "== Context compression" in out
    assert all(len(line) <= 100 for line in out.splitlines())
    found = re.search(r"brotli put ([\d.]+)% of them on the wire, zstd ([\d.]+)%", out)
    assert found is not None
    brotli, zstd = map(float, found.groups())
    assert zstd < brotli / 2
