"""Change sources (fetchers) behind one contract: :class:`databus.sources.base.Source`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from databus.core.errors import ConfigError

if TYPE_CHECKING:
    from databus.sources.base import Capturer, Source
    from databus.sources.config import SourceConfig


def open_source(config: SourceConfig, relay_name: str = "relay",
                state_dir: Path | None = None, *, capturer: Capturer | None = None) -> Source:
    """The source named by ``config.url`` (``sqlite:///PATH``, ``mysql://...``,
    ``postgresql://USER@HOST:PORT/DB``, a chain
    relay's ``databus+http://HOST:PORT``), built
    from its config and not yet opened (the caller calls ``open()``; see
    :class:`~databus.sources.base.Source`).

    ``state_dir``: where a source keeps its own state (snapshot progress, the
    MySQL schema history). ``capturer``: the relay's identity (names of state files,
    slot, trim registration, replica id; :class:`~databus.sources.base.Capturer`);
    without it, ``Capturer(relay_name)``.
    """
    from databus.sources.base import Capturer

    who = capturer if capturer is not None else Capturer(relay_name)
    # each source's modules load only when it is used (the MySQL one needs pymysql)
    scheme = urlparse(config.url).scheme
    if scheme == "sqlite":
        from databus.sources.txlog.sqlite import SqliteSource

        return SqliteSource(config, capturer=who, state_dir=state_dir)
    if scheme in ("mysql", "mariadb"):
        try:
            from databus.sources.mysql.source import MysqlSource
        except ImportError as exc:
            raise ConfigError(
                f"the MySQL source needs its driver: pip install 'databus[mysql]' ({exc})"
            ) from exc

        return MysqlSource(config, capturer=who, state_dir=state_dir)
    if scheme in ("postgresql", "postgres"):
        try:
            from databus.sources.postgres.source import PostgresSource
        except ImportError as exc:
            raise ConfigError(
                "the PostgreSQL source needs its driver: pip install 'databus[postgresql]'"
                f" ({exc})") from exc

        return PostgresSource(config, capturer=who, state_dir=state_dir)
    if scheme in ("databus+http", "databus+https", "databus+zk"):
        from databus.sources.chain import ChainSource

        return ChainSource(config, name=who.name)
    raise ConfigError(f"unsupported source url scheme {scheme!r} (supported: sqlite, mysql,"
                      " postgresql, databus+http, databus+https, databus+zk)")
