"""The README's Python example runs as written, over every transport its comment promises."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README.md has no python example"
    return str(blocks[0])


@pytest.mark.parametrize("scheme", ["ws", "wss", "quic"])
def test_readme_example_runs(scheme: str, tmp_path: Path) -> None:
    code = readme_example()
    assert '"ws://127.0.0.1:0"' in code
    script = tmp_path / "example.py"
    script.write_text(code.replace('"ws://127.0.0.1:0"', f'"{scheme}://127.0.0.1:0"'))
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=README.parent,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # The JSON reply is a parsed value, not None; the text reply is text.
    assert "{'echo': {'model': 'gpt-4o', 'messages': [{'role': 'user', 'content': 'Hi'}]}}" in lines[1]
    assert lines[2] == "HELLO"
