"""The soak's checker (``tests/support/soak.py``): what the databases committed, what a
recorder received, and how the two compare.

* :func:`mariadb_committed`: the transactions in a MariaDB binlog from a position, read
  with ``mariadb-binlog --base64-output=decode-rows -v`` (the server's own tool, not our
  decoder): each GTID group with row changes of one database is one transaction, its
  changes (table, op, primary key: the first column) in binlog order, its id the GTID.
* :class:`History`: a recorder's file (one JSON line per window: SCN, transaction ids,
  rows), read incrementally.
* :func:`check_history`: a window seen again must be the same (a whole window replayed
  after a restart from a checkpoint: ``duplicated``; a different one: ``torn``); a new
  SCN below one seen is ``reordered``; each window's transaction ids must be consecutive
  committed transactions and its rows exactly theirs (else ``torn``; unknown ids
  ``phantom``); committed transactions in no window are ``lost``.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.mariadb import MariaDB, _binary

Change = tuple[str, str, str]  # table (last part of its name), op letter, key as JSON
Window = tuple[int, tuple[str, ...], str]  # scn, transaction ids, changes (as rows_text)


def rows_text(changes: list[Change] | list[list[str]]) -> str:
    """Changes as one canonical JSON text: a 30-minute soak records millions of windows,
    and a string per window holds them in a fifth of the memory tuples would take."""
    return json.dumps(changes)


@dataclass(frozen=True)
class Tx:
    id: str
    changes: str  # rows_text of its changes, in commit order


class History:
    """A recorder's file, parsed incrementally (it only grows; a cut last line waits)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.windows = path, 0, list[Window]()

    def read(self) -> list[Window]:
        if not self.path.exists():
            return self.windows
        with self.path.open("rb") as f:
            f.seek(self.offset)
            while data := f.read(32 << 20):  # a long soak's file is gigabytes
                whole = data.rfind(b"\n") + 1
                if not whole:
                    break
                for line in data[:whole].splitlines():
                    rec = json.loads(line)
                    self.windows.append((rec["scn"], tuple(rec["tx"]),
                                         rows_text(rec["events"])))
                self.offset += whole
                f.seek(self.offset)
        return self.windows


# -- the checker ----------------------------------------------------------------------

def check_history(windows: list[Window], committed: list[Tx]) -> dict[str, Any]:
    """Counts of what a recorder's windows did wrong against ``committed`` (see the
    module docstring); ``problems``: the first few, in words."""
    out: dict[str, Any] = {"windows_recorded": len(windows), "transactions": len(committed), "lost": 0,
           "torn": 0, "reordered": 0, "duplicated": 0, "phantom": 0}
    problems: list[str] = []

    def bad(what: str, msg: str) -> None:
        out[what] += 1
        if len(problems) < 10:
            problems.append(msg)

    first: dict[int, tuple[tuple[str, ...], str]] = {}
    order: list[int] = []
    top = -1
    for scn, txs, events in windows:
        if scn in first:
            if first[scn] == (txs, events):
                out["duplicated"] += 1
            else:
                bad("torn", f"window {scn} repeated with different content")
            continue
        if scn < top:
            bad("reordered", f"window {scn} after {top}")
        first[scn] = (txs, events)
        order.append(scn)
        top = max(top, scn)
    index = {t.id: i for i, t in enumerate(committed)}
    delivered: set[int] = set()
    last = -1
    for scn in order:
        txs, events = first[scn]
        idx = [index.get(t) for t in txs]
        known = [i for i in idx if i is not None]
        if len(known) != len(idx):
            bad("phantom", f"window {scn}: transactions {txs} not all committed")
            continue
        if known != list(range(known[0], known[0] + len(known))):
            bad("torn", f"window {scn}: transactions {txs} not consecutive")
        want = committed[known[0]].changes if len(known) == 1 else rows_text(
            [c for i in known for c in json.loads(committed[i].changes)])
        if events != want:
            got, should = json.loads(events), json.loads(want)
            bad("torn", f"window {scn} ({txs}): {len(got)} rows, committed {len(should)}"
                        f" ({got[:4]} against {should[:4]})")
        if known[0] <= last:
            bad("reordered", f"window {scn} ({txs}) after transaction #{last}")
        last = max(last, known[-1])
        delivered.update(known)
    out["windows"] = len(order)
    out["lost"] = len(committed) - len(delivered)
    if out["lost"]:
        missing = [committed[i].id for i in range(len(committed)) if i not in delivered]
        problems.append(f"{out['lost']} transactions lost, the first {missing[:5]}")
    out["problems"] = problems
    return out


def _lines(args: list[str]) -> Iterator[str]:
    """The output lines of ``args`` as they come (a long soak's binlog is gigabytes of
    text); raises if it fails."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    with proc:
        yield from proc.stdout
        err = proc.stderr.read() if proc.stderr is not None else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{args[0]} exited with {proc.returncode}: {err.strip()}")


def mariadb_committed(server: MariaDB, start: tuple[str, int], db: str) -> list[Tx]:
    """The transactions of ``db`` in ``server``'s binlog from ``start`` (file, position),
    read with ``mariadb-binlog`` (see the module docstring)."""
    names = [n.strip() for n in (server.datadir / "binlog.index").read_text().splitlines()]
    files = [server.datadir / Path(n).name for n in names if n and Path(n).name >= start[0]]
    out: list[Tx] = []
    row = re.compile(r"^### (INSERT INTO|UPDATE|DELETE FROM) `([^`]*)`\.`([^`]*)`")
    ops = {"INSERT INTO": "c", "UPDATE": "u", "DELETE FROM": "d"}
    for f in files:
        more = [f"--start-position={start[1]}"] if f.name == start[0] else []
        gtid, changes, want_key = "", list[Change](), ""
        table = ""
        for line in _lines([_binary("mariadb-binlog"), "--base64-output=decode-rows", "-v",
                            *more, str(f)]):
            if line.startswith("#") and "\tGTID " in line:
                gtid, changes = line.split("\tGTID ", 1)[1].split()[0], []
            elif line.startswith("### "):
                m = row.match(line)
                if m:
                    want_key = ops[m.group(1)] if m.group(2) == db else ""
                    table = m.group(3)
                elif want_key and line.startswith("###   @1="):
                    changes.append((table, want_key, json.dumps(int(line[9:].split()[0]))))
                    want_key = ""
            elif line.startswith("COMMIT") or (line.startswith("#") and "\tXid = " in line):
                if changes and gtid:
                    out.append(Tx(gtid, rows_text(changes)))
                gtid, changes = "", []
    return out
