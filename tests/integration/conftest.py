"""Fixtures of the integration tests: a private MariaDB with binlog settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mariadb import MariaDB


@pytest.fixture
def server(tmp_path: Path) -> Iterator[MariaDB]:
    """A private MariaDB server (own datadir and port), stopped after the test."""
    m = MariaDB(tmp_path / "db")
    with m:
        yield m
