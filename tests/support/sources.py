"""Sources for tests, built the way the relay builds them: from a validated
``SourceConfig`` (config errors are ``ConfigError``), then opened."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from databus.sources.config import (
    AnySourceConfig,
    MysqlSourceConfig,
    SqliteSourceConfig,
    parse_source,
)
from databus.sources.mysql.source import MysqlSource
from databus.sources.txlog.sqlite import SqliteSource


def source_config(url: str, tables: Sequence[str], **fields: Any) -> AnySourceConfig:
    """A validated config of the URL's kind; ``fields`` are its model's own names."""
    return parse_source({"url": url, "tables": list(tables), **fields})


def mysql_source(url: str, tables: Sequence[str], *, name: str = "relay",
                 state_dir: Path | None = None, compiled: bool = True,
                 heartbeat: float = 1.0, **fields: Any) -> MysqlSource:
    """An opened MySQL source (``fields``: SourceConfig's names)."""
    cfg = source_config(url, tables, **fields)
    assert isinstance(cfg, MysqlSourceConfig)
    src = MysqlSource(cfg, name=name, state_dir=state_dir,
                      compiled=compiled, heartbeat=heartbeat)
    src.open()
    return src


def sqlite_source(path: Path | str, tables: Sequence[str], *, name: str = "relay",
                  state_dir: Path | None = None, busy_timeout: float = 5.0,
                  **fields: Any) -> SqliteSource:
    """An opened SQLite source (``fields``: SourceConfig's names)."""
    cfg = source_config(f"sqlite:///{path}", tables, **fields)
    assert isinstance(cfg, SqliteSourceConfig)
    src = SqliteSource(cfg, name=name,
                       state_dir=state_dir, busy_timeout=busy_timeout)
    src.open()
    return src
