"""Relay configuration: validated models and the one loader.

A YAML (or JSON) file maps onto :class:`RelayConfig`; every field has a
default except the source. Example (``docs/relay.md`` has the full reference)::

    name: relay
    source:
      url: sqlite:///shop.db
      tables: [orders, customers]
    buffer:
      capacity_bytes: 67108864
      path: /var/lib/databus/relay.buf
    http:
      port: 11115
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from databus.core.config import FrozenModel, load_file, validate

_Model = FrozenModel


class SourceConfig(_Model):
    """Where changes come from."""

    url: str = Field(description="sqlite:///PATH.db, or mysql://USER:PASS@HOST:PORT")
    tables: list[str] = Field(
        default_factory=list,
        description="tables to capture (names for SQLite; regexes 'db\\.table' for MySQL)",
    )
    poll_interval: float = Field(0.05, gt=0, le=60, description="seconds between idle polls")
    exclude_tables: list[str] = Field(
        default_factory=list, description="MySQL: regexes on 'db.table' left out after --tables")
    include_columns: list[str] = Field(
        default_factory=list,
        description="MySQL: regexes on 'db.table.column' to keep (empty = all); keys always kept")
    exclude_columns: list[str] = Field(
        default_factory=list, description="MySQL: regexes on 'db.table.column' to leave out")
    server_id: int = Field(
        1_000_001, ge=1, le=2**32 - 1,
        description="MySQL: the replica server id this relay uses (unique per server)")

    start_gtid: str | None = Field(
        None, pattern=r"^(\d+-\d+-\d+(,\d+-\d+-\d+)*|[0-9a-fA-F-]{36}(:\d+(-\d+)?)+"
                      r"(,[0-9a-fA-F-]{36}(:\d+(-\d+)?)+)*)$",
        description="MySQL: a new relay starts right after this GTID state instead of at the"
                    " binlog's end: MariaDB '0-1-1234', MySQL 'uuid:1-1234'")
    snapshot_mode: str = Field(
        "initial", pattern=r"^(initial|initial_only|no_data|when_needed|always)$",
        description="initial (existing rows as a snapshot, then stream; the default),"
                    " initial_only, no_data (stream only), when_needed (snapshot when the"
                    " position is gone), always (snapshot at every start)")
    signal_table: str = Field(
        "databus.signals", pattern=r"^[^.\s]+\.[^.\s]+$",
        description="MySQL: db.table of signals and snapshot watermarks (created when a"
                    " snapshot mode needs it)")
    snapshot_chunk_size: int = Field(1024, ge=1, le=1_000_000,
                                     description="rows per snapshot chunk (SQLite and MySQL)")

    @field_validator("exclude_tables", "include_columns", "exclude_columns")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        import re

        for p in v:
            try:
                re.compile(p)
            except re.error as exc:
                raise ValueError(f"bad regex {p!r}: {exc}") from exc
        return v

    @field_validator("url")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if "://" not in v:
            raise ValueError("source url needs a scheme, e.g. sqlite:///path.db")
        return v


class BufferConfig(_Model):
    """The event buffer."""

    capacity_bytes: int = Field(64 * 1024 * 1024, ge=64 * 1024, description="bytes of events held")
    path: Path | None = Field(
        None, description="file for a persistent (mmap) buffer recovered on restart; None = memory"
    )
    index_block: int = Field(16 * 1024, ge=512, description="bytes per sparse SCN index entry")
    flush_interval: float = Field(
        1.0, gt=0, le=3600, description="seconds between buffer flushes and state writes"
    )
    recover: bool = Field(
        False, description="a persistent buffer whose windows fail validation keeps its valid"
        " prefix and reads the rest again from the source; false = refuse to start")


class RelayHttpConfig(_Model):
    host: str = "127.0.0.1"
    port: int = Field(11115, ge=0, le=65535, description="0 picks a free port")


class StreamConfig(_Model):
    """Limits of /stream requests."""

    default_size: int = Field(1024 * 1024, ge=1024, description="bytes per response by default")
    max_size: int = Field(64 * 1024 * 1024, ge=1024, description="largest allowed size")
    default_timeout: float = Field(5.0, ge=0, description="long-poll seconds by default")
    max_timeout: float = Field(60.0, ge=0, description="longest allowed long-poll")


class RelayConfig(_Model):
    """Everything a relay needs."""

    name: str = Field("relay", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
    source: SourceConfig
    buffer: BufferConfig = BufferConfig()
    http: RelayHttpConfig = RelayHttpConfig()
    stream: StreamConfig = StreamConfig()
    state_dir: Path | None = Field(
        None, description="where relay state (MaxSCN) is kept; default: beside the buffer file"
    )
    retry_initial: float = Field(0.2, gt=0, description="first backoff after a source error, s")
    retry_max: float = Field(10.0, gt=0, description="longest backoff after source errors, s")


def parse_config(raw: Any) -> RelayConfig:
    """Validate a mapping; raises :class:`ConfigError` naming each bad field."""
    return validate(RelayConfig, raw, "relay")


def load_config(path: Path) -> RelayConfig:
    """Read and validate a YAML/JSON config file."""
    return load_file(path, parse_config)
