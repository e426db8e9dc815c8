"""Files a test keeps for people to look at after the run (screenshots): under
``$DATABUS_TEST_ARTIFACTS``, else ``test-artifacts/`` at the checkout's top (ignored by
git). Unlike a test's ``tmp_path``, they outlive a passing test."""

from __future__ import annotations

import os
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]


def artifact(name: str) -> Path:
    """The path of artifact ``name`` (its directory made; an older file of that name is
    replaced by the test that writes it)."""
    root = Path(os.environ.get("DATABUS_TEST_ARTIFACTS") or TOP / "test-artifacts")
    root.mkdir(parents=True, exist_ok=True)
    return root / name
