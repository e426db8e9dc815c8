"""Checkpoint stores: where a consumer's position survives restarts.

A store holds one :class:`~databus.core.checkpoint.Checkpoint`. The client
loads it once when it starts and saves it after a window has been consumed
completely and ``on_checkpoint`` succeeded (every window by default, see
``ClientConfig.checkpoint_every_windows``); it never saves in the middle of a
window. A store never silently forgets a position: a stored checkpoint that
cannot be parsed raises :class:`~databus.core.errors.InvalidCheckpointError`
naming where it is, instead of restarting from scratch.

* :class:`FileCheckpointStore` (the default): a JSON file replaced atomically
  (temp file in the same directory, fsync, ``os.replace``, directory fsync).
* :class:`SqlCheckpointStore`: one row per consumer name in a table
  (``databus_checkpoint`` by default) of any SQLAlchemy database; it can also
  write inside a caller's open transaction (:meth:`SqlCheckpointStore.save_in`),
  which is how a sink commits its effect and its position together.
* :class:`MemoryCheckpointStore`: nothing survives the process (tests, tools).

Stores are used by one client thread; they are not safe for concurrent use.
"""

from __future__ import annotations

import os
import socket
import time
from abc import ABC, abstractmethod
from pathlib import Path

import sqlalchemy as sa

from databus.client.sql import make_engine, redacted, translate_db_errors
from databus.core.atomic import write_atomic
from databus.core.checkpoint import Checkpoint
from databus.core.errors import CheckpointStoreError, InvalidCheckpointError


class CheckpointStore(ABC):
    """Persists one checkpoint. ``load`` returns None when none was stored yet."""

    @abstractmethod
    def load(self) -> Checkpoint | None:
        """The stored checkpoint, or None. Raises InvalidCheckpointError if corrupt."""

    @abstractmethod
    def save(self, checkpoint: Checkpoint) -> None:
        """Persist ``checkpoint`` durably before returning."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Idempotent."""


class MemoryCheckpointStore(CheckpointStore):
    """Keeps the checkpoint in memory only."""

    def __init__(self, checkpoint: Checkpoint | None = None) -> None:
        self.checkpoint = checkpoint
        self.saves = 0

    def load(self) -> Checkpoint | None:
        return self.checkpoint

    def save(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.saves += 1


class FileCheckpointStore(CheckpointStore):
    """A JSON file, replaced atomically on every save."""

    def __init__(self, path: str | Path, *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.fsync = fsync

    def load(self) -> Checkpoint | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CheckpointStoreError(f"cannot read checkpoint file {self.path}: {exc}") from exc
        try:
            return Checkpoint.from_json(data)
        except InvalidCheckpointError as exc:
            raise InvalidCheckpointError(
                f"checkpoint file {self.path} is corrupt ({exc}); repair it, or delete it "
                "to start this consumer again from scratch"
            ) from exc

    def save(self, checkpoint: Checkpoint) -> None:
        try:
            write_atomic(self.path, checkpoint.to_json().encode("utf-8") + b"\n",
                         fsync=self.fsync)
        except OSError as exc:
            raise CheckpointStoreError(
                f"cannot write checkpoint file {self.path}: {exc}") from exc

    def __repr__(self) -> str:
        return f"FileCheckpointStore({str(self.path)!r})"


def checkpoint_table(metadata: sa.MetaData, name: str = "databus_checkpoint") -> sa.Table:
    """The checkpoint table: one row per consumer name."""
    return sa.Table(
        name, metadata,
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("checkpoint", sa.Text, nullable=False),
        sa.Column("updated_ns", sa.BigInteger, nullable=False),
    )


class SqlCheckpointStore(CheckpointStore):
    """A row ``(name, checkpoint JSON, updated_ns)`` in a SQLAlchemy database.

    ``engine_or_url``: an Engine (not disposed by :meth:`close`) or a URL (an
    engine is created and disposed by :meth:`close`). The table is created if
    missing. Lost connections raise
    :class:`~databus.core.errors.SinkUnavailableError` (transient).
    """

    def __init__(self, engine_or_url: sa.Engine | str, name: str,
                 table: str = "databus_checkpoint") -> None:
        if not name or len(name) > 255:
            raise ValueError("checkpoint name must be 1-255 characters")
        self._owned = isinstance(engine_or_url, str)
        self.engine = make_engine(engine_or_url) if isinstance(engine_or_url, str) else engine_or_url
        self.name = name
        self.table = checkpoint_table(sa.MetaData(), table)
        self._created = False

    def ensure_table(self, conn: sa.Connection | None = None) -> None:
        """Create the checkpoint table if it does not exist."""
        if self._created:
            return
        with translate_db_errors("creating the checkpoint table", self.engine):
            if conn is not None:
                self.table.create(conn, checkfirst=True)
            else:
                with self.engine.begin() as own:
                    self.table.create(own, checkfirst=True)
        self._created = True

    def load_in(self, conn: sa.Connection, *, for_update: bool = False) -> Checkpoint | None:
        """Read the checkpoint with ``conn`` (inside its transaction).

        ``for_update`` locks the row until the transaction ends where the
        database supports it, so two writers serialise.
        """
        self.ensure_table(conn)
        q = sa.select(self.table.c.checkpoint).where(self.table.c.name == self.name)
        if for_update and conn.dialect.name != "sqlite":
            q = q.with_for_update()
        with translate_db_errors("reading the checkpoint", self.engine):
            text = conn.execute(q).scalar_one_or_none()
        if text is None:
            return None
        try:
            return Checkpoint.from_json(text)
        except InvalidCheckpointError as exc:
            raise InvalidCheckpointError(
                f"checkpoint {self.name!r} in table {self.table.name} of {redacted(self.engine)} "
                f"is corrupt ({exc}); repair or delete that row"
            ) from exc

    def save_in(self, conn: sa.Connection, checkpoint: Checkpoint) -> None:
        """Write the checkpoint with ``conn``; it commits with the caller's transaction."""
        self.ensure_table(conn)
        t = self.table
        values = {"checkpoint": checkpoint.to_json(), "updated_ns": time.time_ns()}
        with translate_db_errors("saving the checkpoint", self.engine):
            res = conn.execute(sa.update(t).where(t.c.name == self.name).values(**values))
            if res.rowcount == 0:
                conn.execute(sa.insert(t).values(name=self.name, **values))

    def load(self) -> Checkpoint | None:
        with translate_db_errors("reading the checkpoint", self.engine), self.engine.connect() as conn:
            cp = self.load_in(conn)
            conn.commit()
            return cp

    def save(self, checkpoint: Checkpoint) -> None:
        with translate_db_errors("saving the checkpoint", self.engine), self.engine.begin() as conn:
            self.save_in(conn, checkpoint)

    def close(self) -> None:
        if self._owned:
            self.engine.dispose()

    def __repr__(self) -> str:
        return f"SqlCheckpointStore({redacted(self.engine)!r}, {self.name!r})"


def consumer_name(store: CheckpointStore) -> str:
    """The name a consumer given none sends (``ClientConfig.consumer_name``): its
    checkpoint store's (a file's name, a SQL store's row) at this host, else
    ``<host>-<pid>``."""
    host = socket.gethostname()
    if isinstance(store, FileCheckpointStore):
        return f"{store.path.name}@{host}"
    named = getattr(store, "name", None)
    if isinstance(named, str) and named:
        return f"{named}@{host}"
    return f"{host}-{os.getpid()}"
