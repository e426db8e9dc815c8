"""From a source config to its source: the one place that maps each kind of source
(:mod:`databus.sources.config`) to the class that captures it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from databus.core.errors import ConfigError

if TYPE_CHECKING:
    from databus.sources.base import Capturer, Source
    from databus.sources.config import AnySourceConfig


def open_source(config: AnySourceConfig, relay_name: str = "relay",
                state_dir: Path | None = None, *, capturer: Capturer | None = None) -> Source:
    """The source ``config`` describes (its model is its kind:
    :mod:`databus.sources.config`), built and not yet opened (the caller calls
    ``open()``; see :class:`~databus.sources.base.Source`).

    ``state_dir``: where a source keeps its own state (snapshot progress, the
    MySQL schema history). ``capturer``: the relay's identity (names of state files,
    slot, trim registration, replica id; :class:`~databus.sources.base.Capturer`);
    without it, ``Capturer(relay_name)``.
    """
    from databus.sources.base import Capturer
    from databus.sources.config import (
        ChainSourceConfig,
        MysqlSourceConfig,
        PostgresSourceConfig,
        SqliteSourceConfig,
    )

    who = capturer if capturer is not None else Capturer(relay_name)
    # each source's modules load only when it is used (the MySQL one needs pymysql)
    if isinstance(config, SqliteSourceConfig):
        from databus.sources.txlog.sqlite import SqliteSource

        return SqliteSource(config, capturer=who, state_dir=state_dir)
    if isinstance(config, MysqlSourceConfig):
        try:
            from databus.sources.mysql.source import MysqlSource
        except ImportError as exc:
            raise ConfigError(
                f"the MySQL source needs its driver: pip install 'databus[mysql]' ({exc})"
            ) from exc

        return MysqlSource(config, capturer=who, state_dir=state_dir)
    if isinstance(config, PostgresSourceConfig):
        try:
            from databus.sources.postgres.source import PostgresSource
        except ImportError as exc:
            raise ConfigError(
                "the PostgreSQL source needs its driver: pip install 'databus[postgresql]'"
                f" ({exc})") from exc

        return PostgresSource(config, capturer=who, state_dir=state_dir)
    if isinstance(config, ChainSourceConfig):
        from databus.sources.chain import ChainSource

        return ChainSource(config, name=who.name)
    raise ConfigError(f"not a source config: {type(config).__name__}")
