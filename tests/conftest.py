"""Shared test fixtures: reference data location and transport parametrisation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "shared" / "reference"


@pytest.fixture(scope="session")
def m2m_vectors() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REFERENCE_DIR / "m2m-reference-vectors.json").read_text())
    return data
