"""A relay's identity: its name, everything named after it, and the locks that keep
two relays from sharing any of it.

**The name** is ``name:`` in the config (``--name``), or derived, computed here and
nowhere else (:func:`resolve`): ``<buffer file stem, or "relay">-<6 hex>``, the hex
the start of the SHA-256 of

* with a persistent buffer: the source URL without its password (a SQLite path made
  absolute) and the buffer file's absolute path;
* with a memory buffer: the source URL, the captured tables and the HTTP port
  (port 0 hashes as 0: give such relays a name).

So relays whose buffers share a directory get different names, and a relay started
again with the same source and buffer gets its own name back. The start-up log line
says which name a relay runs under and where it came from.

**What derives from it** (:class:`RelayIdentity`):

* the relay's state ``<state_dir>/<name>.state.json`` (``state_dir``: the config's,
  else the buffer file's directory) and the sources' own state files
  ``<name>.*.json`` there (schema history, snapshot progress, slot record);
* what the capturers of one database share (``shared``): the PostgreSQL slot and
  publication ``databus_<shared>`` and the SQLite trim registration. It is the name;
  for a member of a relay cluster with a derived name, the cluster's name, so that
  every member that comes to lead captures with the same slot;
* the MySQL replica ``server_id`` (unless ``source.server_id`` is set):
  :func:`~databus.sources.base.derived_server_id` of the name (for a cluster member
  with a given name, shared by the members: of ``<name>/<member id>``, so a leader
  and its co-leaders never share one).

**Before names were derived** every relay was named ``relay``. A relay whose name
was derived and that has no state of its own refuses to start, with one line naming
``--name relay``, when its state directory holds ``relay.*.json`` files written
before (:func:`check_legacy_state`); the sources do the same for a ``databus_relay``
slot and a ``relay`` trim registration (:class:`~databus.sources.base.Capturer`).
Adopting them could take another relay's position (two relays sharing a directory
shared those files); ignoring them would orphan a slot or a registration that holds
the database's log for ever. ``--name relay`` keeps them; a state file written since
records its relay's name, so it is never taken for a legacy one.

**Locks** (:class:`Claim`): while it runs a relay holds an exclusive ``flock`` on
``<state_dir>/<name>.lock`` and on ``<buffer file>.lock``; a second relay with the
same name in the same state directory, or the same buffer file, is refused at start
with one line naming both (the holder is read from the lock file).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from databus.buffer.persist import check_adoptable
from databus.core.errors import ConfigError
from databus.core.lockfile import LockFile
from databus.relay.config import RelayConfig
from databus.sources.base import LEGACY_NAME, Capturer, derived_server_id

__all__ = ["LEGACY_NAME", "Claim", "RelayIdentity", "check_legacy_state", "default_member_id",
           "resolve"]


@dataclass(frozen=True)
class RelayIdentity:
    """A relay's resolved identity (see the module docstring)."""

    name: str
    derived: bool
    """True: computed from the source and buffer; False: ``name:`` / ``--name``."""
    origin: str
    """Where the name came from, for people (the start-up log, ``/admin``)."""
    shared: str
    server_id: int
    state_dir: Path | None
    host: str

    @property
    def state_path(self) -> Path | None:
        return self.state_dir / f"{self.name}.state.json" if self.state_dir else None

    @property
    def legacy(self) -> str | None:
        """The name whose artifacts a fresh start must not silently adopt or orphan."""
        return LEGACY_NAME if self.derived else None

    def capturer(self) -> Capturer:
        """What the sources need of it."""
        return Capturer(name=self.name, shared=self.shared, server_id=self.server_id,
                        legacy=self.legacy, host=self.host)

    def describe(self) -> dict[str, Any]:
        """For ``/admin``."""
        return {"name": self.name, "derived": self.derived, "from": self.origin,
                "shared": self.shared, "server_id": self.server_id,
                "state_dir": str(self.state_dir) if self.state_dir else None}


def default_member_id() -> str:
    """A cluster member's id when ``cluster.member_id`` is not set: ``host-pid``."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _source_key(url: str) -> str:
    """The source URL as the derived name hashes it: without its password (given in the
    URL or a file, the same relay), a SQLite path absolute (the same database from any
    working directory)."""
    if url.startswith("sqlite:///"):
        return "sqlite:///" + str(Path(url[len("sqlite:///"):]).resolve())
    try:
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)[-1]
        user = parts.username
    except ValueError:
        return url
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc}" if user else netloc))


def _stem(path: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem)[:80].strip(".")
    return stem or LEGACY_NAME


def derive_name(config: RelayConfig) -> tuple[str, str]:
    """The derived name and, for people, what it was derived from."""
    source = _source_key(config.source.url)
    path = config.buffer.path
    if path is not None:
        buffer = path.resolve()
        key = f"{source}\n{buffer}"
        stem, why = _stem(path), f"its source and buffer file {buffer}"
    else:
        key = f"{source}\n{json.dumps(sorted(config.source.tables))}\n{config.http.port}"
        stem, why = LEGACY_NAME, f"its source, tables and port {config.http.port}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:6]
    return f"{stem}-{digest}", why


def resolve(config: RelayConfig) -> RelayIdentity:
    """The identity ``config`` gives a relay; computed once, at its start."""
    cluster = config.cluster
    state_dir = config.state_dir or (config.buffer.path.parent if config.buffer.path else None)
    if config.name is not None:
        name, derived, origin = config.name, False, "given (name: in the config, or --name)"
        shared = name
    else:
        name, why = derive_name(config)
        derived, origin = True, f"derived from {why}; set name: (--name) to choose one"
        shared = cluster.zk_address().name if cluster is not None else name
    # only MySQL/MariaDB sources have one (the source model may be one per kind)
    server_id: int | None = getattr(config.source, "server_id", None)
    if server_id is None:
        key = name
        if cluster is not None and not derived:  # members share a given name
            key = f"{name}/{cluster.member_id or default_member_id()}"
        server_id = derived_server_id(key)
    return RelayIdentity(name=name, derived=derived, origin=origin, shared=shared,
                         server_id=server_id, state_dir=state_dir, host=socket.gethostname())


_SOURCE_STATE = re.compile(r"^(?P<name>.+)\.(state|mysql-schemas|mysql-snapshot|postgres-slot"
                           r"|postgres-schemas|postgres-snapshot|sqlite-snapshot)\.json$")


def check_legacy_state(identity: RelayIdentity) -> None:
    """Refuse (one line naming ``--name relay``) a relay with a derived name and no state
    of its own whose state directory holds state files of the legacy name written
    before names were derived (see the module docstring)."""
    legacy, where = identity.legacy, identity.state_dir
    if legacy is None or where is None or not where.is_dir():
        return
    own = identity.state_path
    if own is not None and own.exists():
        return
    found = sorted(p.name for p in where.iterdir()
                   if (m := _SOURCE_STATE.match(p.name)) and m["name"] == legacy)
    if not found:
        return
    state = where / f"{legacy}.state.json"
    if state.exists():
        try:
            if "name" in json.loads(state.read_text(encoding="utf-8")):
                return  # written since: a relay named relay on purpose, not this one's
        except (OSError, ValueError):
            pass  # unreadable: treated as from before
    raise ConfigError(
        f"{where} holds relay state from before relays had their own names"
        f" ({', '.join(found)}) and this relay, named {identity.name} ({identity.origin}),"
        f" has none: if that state is this relay's, start it with --name {legacy} (name:"
        f" {legacy}) to keep its position; if not, give this relay a name or its own"
        " state_dir")


# -- locks ---------------------------------------------------------------------------


class Claim:
    """The locks a relay holds while it runs (see the module docstring). Taken before
    anything is written: the buffer file (when one exists it must be a buffer file) and
    the state directory's name."""

    def __init__(self, identity: RelayIdentity, config: RelayConfig) -> None:
        self.identity = identity
        self.buffer_path = config.buffer.path
        self._holder: dict[str, Any] = {
            "what": f"relay {identity.name}", "relay": identity.name, "pid": os.getpid(), "host": identity.host,
            "port": config.http.port, "since": time.time(),
            "buffer": str(self.buffer_path) if self.buffer_path else None}
        self._locks: list[LockFile] = []
        try:
            if self.buffer_path is not None:
                if os.path.lexists(self.buffer_path):
                    check_adoptable(self.buffer_path)  # nothing written next to a stranger
                self._locks.append(LockFile.take(
                    self.buffer_path.with_name(self.buffer_path.name + ".lock"), self._holder,
                    f"refusing to start relay {identity.name}: its buffer file"
                    f" {self.buffer_path} is in use by another relay; two relays cannot share"
                    " one: give each its own buffer.path (--buffer-path)"))
            if identity.state_dir is not None:
                self._locks.append(LockFile.take(
                    identity.state_dir / f"{identity.name}.lock", self._holder,
                    f"refusing to start relay {identity.name}: its state"
                    f" {identity.state_path} is in use by another relay of that name; two"
                    " relays in one state directory need different names: give this one"
                    " another name (--name, name:) or its own state_dir"))
        except BaseException:
            self.release()
            raise

    def serving_at(self, url: str) -> None:
        """Say where this relay serves (the lock files name it to a refused relay)."""
        self._holder["url"] = url
        for lock in self._locks:
            with contextlib.suppress(OSError):
                lock.write(self._holder)

    def release(self) -> None:
        for lock in self._locks:
            lock.release()
        self._locks = []
