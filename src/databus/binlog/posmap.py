"""The position map (``<base>.state``): what a binlog data directory holds, as JSON.

Fields: ``format`` (:data:`STATE_FORMAT`, our marker), ``version`` 1, ``base``, the
``server_uuid`` (generated once, with the directory), ``files`` (every live file with the
GNO of its first transaction, its creation and closing times and, once closed, its whole
size), ``end`` (file, position, last GNO, last relay SCN and the file's logical-clock
counter after the last *whole relay window* written), ``purged_gno`` (the transactions
of purged files are ``uuid:1-purged_gno``) and ``writer`` (the converter's own JSON state
as of the end).

Contract: :func:`write_map` replaces the file atomically (a reader or a crash sees the
old map or the new one, never a mix); :func:`read_map` refuses with one-line
:class:`~databus.core.errors.ConfigError` a file that is not ours (another format or
base), malformed, or whose end is not in its last file. What the map means for the
files (it is never ahead of them; files are cut back to it) is the store's
(:mod:`databus.binlog.store`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from databus.core.atomic import write_atomic
from databus.core.errors import ConfigError

STATE_FORMAT = "databus-binlog-state"


@dataclass
class FileEntry:
    """One live binlog file."""

    name: str
    first_gno: int  # GNO of the file's first transaction (= executed count before + 1)
    created: float
    closed: float | None = None  # when its Rotate was recorded
    size: int = 0  # closed files: whole size

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "first_gno": self.first_gno, "created": self.created,
                "closed": self.closed, "size": self.size}


@dataclass
class End:
    """Where the last whole relay window written ends."""

    file: str
    pos: int
    gno: int  # last GNO written (0: none)
    scn: int  # relay SCN of the last window written (-1: none)
    seq: int  # logical clock: transactions in the current file


@dataclass(frozen=True)
class PositionMap:
    """One map as read (see the module docstring)."""

    server_uuid: str
    files: list[FileEntry]
    end: End
    purged_gno: int
    writer: dict[str, Any]


def write_map(path: Path, *, base: str, server_uuid: str, files: list[FileEntry], end: End,
              purged_gno: int, writer: dict[str, Any]) -> None:
    """Replace the map at ``path`` atomically."""
    state = {"format": STATE_FORMAT, "version": 1, "server_uuid": server_uuid,
             "base": base, "files": [f.to_json() for f in files],
             "end": vars(end), "purged_gno": purged_gno, "writer": writer}
    write_atomic(path, json.dumps(state, indent=1).encode())


def read_map(path: Path, base: str) -> PositionMap:
    """The map at ``path`` of the data directory's ``base`` (ConfigError when it is not
    one, see the module docstring)."""
    try:
        raw = json.loads(path.read_bytes())
        if not isinstance(raw, dict) or raw.get("format") != STATE_FORMAT or raw.get("base") != base:
            raise ValueError("not a databus binlog state of this base")
        files = [FileEntry(f["name"], int(f["first_gno"]), float(f["created"]),
                           None if f["closed"] is None else float(f["closed"]),
                           int(f["size"])) for f in raw["files"]]
        e = raw["end"]
        out = PositionMap(
            server_uuid=str(uuid.UUID(raw["server_uuid"])), files=files,
            end=End(str(e["file"]), int(e["pos"]), int(e["gno"]), int(e["scn"]),
                    int(e["seq"])),
            purged_gno=int(raw["purged_gno"]), writer=dict(raw.get("writer") or {}))
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is not a databus binlog state: {exc}") from exc
    if not out.files or out.files[-1].name != out.end.file:
        raise ConfigError(f"{path}: the end is not in the last file")
    return out
