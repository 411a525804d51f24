"""Style gates that CI enforces with the test suite: ruff (lint + format) and mypy --strict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ["m2mwire", "tests", "examples", "benchmarks"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_lint_clean() -> None:
    done = _run("ruff", "check", "--no-cache", *CODE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_clean() -> None:
    done = _run("ruff", "format", "--check", "--no-cache", *CODE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_clean() -> None:
    done = _run("mypy")
    assert done.returncode == 0, done.stdout + done.stderr
