"""Binlog test helpers: run ``mariadb-binlog --verbose`` on our files and replay its
decoded rows into a model; and a converter process to kill (``python -m
tests.support.binlog RELAY_URL DATA_DIR``)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARIADB_BINLOG = "/usr/bin/mariadb-binlog"


@dataclass
class Decoded:
    """What mariadb-binlog printed: row changes per table (op, before, after) in order,
    Xid values, GTID event count, DDL statements, and its stderr."""

    changes: list[tuple[str, str, list[Any] | None, list[Any] | None]] = field(
        default_factory=list)
    xids: list[int] = field(default_factory=list)
    gtids: int = 0
    ddl: list[str] = field(default_factory=list)
    stderr: bytes = b""


def _value(raw: bytes) -> Any:
    if raw == b"NULL":
        return None
    if raw.startswith(b"'") and raw.endswith(b"'"):
        body = raw[1:-1]
        return re.sub(rb"\\x([0-9a-f]{2})", lambda m: bytes([int(m.group(1), 16)]), body)
    return raw.decode()


def mariadb_decode(files: list[Path]) -> Decoded:
    """Run mariadb-binlog --verbose over ``files`` (in order) and parse its output."""
    proc = subprocess.run([MARIADB_BINLOG, "--verbose", *map(str, files)],
                          capture_output=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return parse_verbose(proc.stdout, proc.stderr)


def parse_verbose(stdout: bytes, stderr: bytes = b"") -> Decoded:
    """What ``mariadb-binlog --verbose`` printed (``stdout``), parsed."""
    out = Decoded(stderr=stderr)
    op = table = ""
    images: list[list[Any]] = []
    lines = stdout.split(b"\n")

    def end_change() -> None:
        nonlocal images
        if op:
            if op == "INSERT":
                out.changes.append((table, op, None, images[0]))
            elif op == "DELETE":
                out.changes.append((table, op, images[0], None))
            else:
                out.changes.append((table, op, images[0], images[1]))
        images = []

    for i, line in enumerate(lines):
        m = re.match(rb"### (INSERT INTO|UPDATE|DELETE FROM) `([^`]*)`\.`([^`]*)`", line)
        if m:
            end_change()
            op = m.group(1).split()[0].decode()
            table = f"{m.group(2).decode()}.{m.group(3).decode()}"
            continue
        if line in (b"### SET", b"### WHERE"):
            images.append([])
            continue
        m = re.match(rb"###   @(\d+)=(.*)$", line)
        if m:
            images[-1].append(_value(m.group(2)))
            continue
        if not line.startswith(b"###") and op:
            end_change()
            op = ""
        m = re.search(rb"\tXid = (\d+)$", line)
        if m:
            out.xids.append(int(m.group(1)))
        if b"Ignorable event type 33" in line:
            out.gtids += 1
        if line.startswith((b"CREATE TABLE", b"ALTER TABLE", b"TRUNCATE TABLE")):
            out.ddl.append(line.decode())
        del i
    end_change()
    return out


def replay(decoded: Decoded, key_index: int = 0) -> dict[str, dict[Any, list[Any]]]:
    """Apply the decoded changes to tables keyed by column ``key_index``; an insert of
    an existing key, or an update/delete of a missing or different row, fails."""
    tables: dict[str, dict[Any, list[Any]]] = {}
    for table, op, before, after in decoded.changes:
        rows = tables.setdefault(table, {})
        if before is not None:
            assert rows.get(before[key_index]) == before, (table, op, before)
            del rows[before[key_index]]
        if after is not None:
            assert after[key_index] not in rows, (table, op, after)
            rows[after[key_index]] = after
    return tables


def main() -> None:
    """Run a converter on ``argv[1]`` (relay URL) into ``argv[2]`` until killed."""
    from databus.binlog.convert import BinlogConverter
    from databus.binlog.store import BinlogStore
    from databus.client.config import ClientConfig

    store = BinlogStore(Path(sys.argv[2]), rotate_bytes=int(sys.argv[3]))
    conv = BinlogConverter(ClientConfig(relay=sys.argv[1], poll_timeout=0.2), store,
                           checkpoint_every=int(sys.argv[4]))
    conv.run(threading.Event())


if __name__ == "__main__":
    main()
