"""Trigger + txlog capture (the seeds' "Databus for Oracle" design); SQLite is the
embedded default. See :mod:`databus.sources.txlog.sqlite` for the guarantees and
:mod:`databus.sources.txlog.catalog` for what is installed in the database."""

from databus.sources.txlog.catalog import forget_relay, install, uninstall
from databus.sources.txlog.sqlite import SqliteSource

__all__ = ["SqliteSource", "forget_relay", "install", "uninstall"]
