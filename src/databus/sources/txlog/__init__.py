"""Trigger + txlog capture ("Databus for Oracle" design); SQLite is the embedded default."""

from databus.sources.txlog.sqlite import SqliteSource, install, uninstall

__all__ = ["SqliteSource", "install", "uninstall"]
