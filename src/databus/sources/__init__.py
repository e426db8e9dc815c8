"""Change sources (fetchers) behind one contract: :class:`databus.sources.base.Source`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from databus.core.errors import ConfigError

if TYPE_CHECKING:
    from databus.relay.config import SourceConfig
    from databus.sources.base import Source


def open_source(config: SourceConfig, relay_name: str = "relay",
                state_dir: Path | None = None) -> Source:
    """The source named by ``config.url`` (``sqlite:///PATH``, ``mysql://...``).

    ``state_dir``: where a source keeps its own state (snapshot progress, the
    MySQL schema history).
    """
    url = urlparse(config.url)
    if url.scheme == "sqlite":
        # sqlite:///relative.db -> "relative.db"; sqlite:////abs/x.db -> "/abs/x.db"
        path = config.url[len("sqlite:///"):]
        if not path:
            raise ConfigError("sqlite source needs a path: sqlite:///PATH.db")
        if not config.tables:
            raise ConfigError("sqlite source needs --tables (the tables to capture)")
        from databus.sources.txlog.sqlite import SqliteSource

        return SqliteSource(path, config.tables, poll_interval=config.poll_interval,
                            relay_name=relay_name, snapshot_mode=config.snapshot_mode,
                            snapshot_chunk_size=config.snapshot_chunk_size,
                            state_dir=state_dir)
    if url.scheme in ("mysql", "mariadb"):
        try:
            from databus.sources.mysql.source import MysqlSource
        except ImportError as exc:
            raise ConfigError(
                f"the MySQL source needs its driver: pip install 'databus[mysql]' ({exc})"
            ) from exc

        return MysqlSource(config.url, config.tables, exclude_tables=config.exclude_tables,
                           include_columns=config.include_columns,
                           exclude_columns=config.exclude_columns, server_id=config.server_id,
                           state_dir=state_dir, name=relay_name,
                           start_gtid=config.start_gtid, snapshot_mode=config.snapshot_mode,
                           signal_table=config.signal_table,
                           chunk_size=config.snapshot_chunk_size)
    raise ConfigError(f"unsupported source url scheme {url.scheme!r} (supported: sqlite, mysql)")
