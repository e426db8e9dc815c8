"""Sources for tests, built the way the relay builds them: from a validated
``SourceConfig`` (config errors are ``ConfigError``), then opened."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from databus.core.config import validate
from databus.sources.config import SourceConfig
from databus.sources.mysql.source import MysqlSource
from databus.sources.txlog.sqlite import SqliteSource


def source_config(url: str, tables: Sequence[str], **fields: Any) -> SourceConfig:
    """A validated config; ``fields`` are SourceConfig's own names."""
    return validate(SourceConfig, {"url": url, "tables": list(tables), **fields}, "source")


def mysql_source(url: str, tables: Sequence[str], *, name: str = "relay",
                 state_dir: Path | None = None, compiled: bool = True,
                 heartbeat: float = 1.0, **fields: Any) -> MysqlSource:
    """An opened MySQL source (``fields``: SourceConfig's names)."""
    src = MysqlSource(source_config(url, tables, **fields), name=name, state_dir=state_dir,
                      compiled=compiled, heartbeat=heartbeat)
    src.open()
    return src


def sqlite_source(path: Path | str, tables: Sequence[str], *, name: str = "relay",
                  state_dir: Path | None = None, busy_timeout: float = 5.0,
                  **fields: Any) -> SqliteSource:
    """An opened SQLite source (``fields``: SourceConfig's names)."""
    src = SqliteSource(source_config(f"sqlite:///{path}", tables, **fields), name=name,
                       state_dir=state_dir, busy_timeout=busy_timeout)
    src.open()
    return src
