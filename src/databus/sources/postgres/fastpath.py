"""A transaction's rows, from pgoutput change messages to encoded events: in C or in Python.

Why C: profiled with py-spy on ``bench.postgres_capture`` (2026-11-25), the
Python path spent about 20 µs per row changed, in this order: the tuple data
loop of :func:`.pgoutput.decode` and its message objects, typing and Avro
writing of each column (:meth:`.types.TableVersion.typed`),
:func:`databus.core.event.encode` with its two CRCs and the metadata part at
the commit, and the loop around them (a psycopg2 ``read_message`` per message,
the error translator's context manager, the dispatch). That put the source at
0.28-0.30 of ``pg_recvlogical``. The compiled path (``_pgcodec.c``) does a
change message's tuple data, its Avro record, its key and, at the commit, its
whole event in C, with no Python object per value; the loop around it reads the
socket's messages in batches (:meth:`.connection.ReplicationStream.read_many`).
Measured after (bench/RESULTS.md, same run, best of 3): 1.48x ``pg_recvlogical``
(1.67x in another run), 4.3x the Python path; the reader then used 0.35 s of CPU
in 1.15 s, waiting the rest for the server's logical decoding.

Two implementations of one contract, :class:`Rows`:

* :meth:`Rows.change` takes an Insert, Update or Delete message (``skip``: the
  4 bytes of a streamed change's transaction id, protocol 2) and returns 1 when
  it decoded it into the transaction's rows, 0 when the table is not captured,
  -1 when the caller must decode it (Python always; C for an update with
  unchanged TOASTed values, an unknown relation, or input it does not parse,
  which Python then reports precisely);
* :meth:`Rows.add` appends a row the caller decoded, in its place;
* :meth:`Rows.commit` returns the events of every row with the commit's SCN
  (and clears them).

Columns a table version leaves out (``include_columns``/``exclude_columns``) are
read past by both, never typed nor written (:meth:`.types.TableVersion.project`;
``K_SKIP`` in C), so the compiled path keeps working for filtered tables.

Both give byte-identical events (tests/integration/test_postgres_source.py
reads the type matrix through both and compares the windows). The C one is
used when the extension is built (``setup.py``); ``PostgresSource(compiled=False)``
forces Python.
"""

from __future__ import annotations

from typing import Any, Protocol

from databus.core import event as ev
from databus.core.avrobin import long_bytes
from databus.core.errors import ConfigError, CorruptEventError
from databus.core.schema import MetadataCodec
from databus.sources.postgres.types import TableVersion

try:  # optional: a machine without a C compiler runs the Python path
    from databus.sources.postgres import _pgcodec  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _pgcodec = None

# keep in step with _pgcodec.c
_KINDS = {"string": 0, "long": 1, "boolean": 2, "double": 3, "bytes": 4}
K_SKIP = 5  # a column left out (include/exclude_columns): read past, never written
KEY_INT, KEY_ROWINDEX, KEY_JSON = 0, 1, 2


def available() -> bool:
    """Whether the C extension is built."""
    return _pgcodec is not None


class Rows(Protocol):
    @property
    def pending(self) -> int: ...

    def relate(self, oid: int, version: TableVersion | None) -> None: ...

    def forget(self, oid: int) -> None: ...

    def change(self, payload: bytes, skip: int) -> int: ...

    def add(self, version: TableVersion, op: ev.Op, key: int | bytes, payload: bytes,
            before: bytes | None) -> None: ...

    def commit(self, scn: int, ts_ns: int, txid: bytes, origin: bytes | None
               ) -> tuple[bytes, int]: ...

    def clear(self) -> None: ...


class PyRows:
    """The Python path: rows kept as (op, version, key, payload, before) until the commit."""

    def __init__(self) -> None:
        self._rows: list[tuple[ev.Op, TableVersion, int | bytes, bytes, bytes | None]] = []

    @property
    def pending(self) -> int:
        return len(self._rows)

    def relate(self, oid: int, version: TableVersion | None) -> None:
        pass

    def forget(self, oid: int) -> None:
        pass

    def change(self, payload: bytes, skip: int) -> int:
        return -1

    def add(self, version: TableVersion, op: ev.Op, key: int | bytes, payload: bytes,
            before: bytes | None) -> None:
        self._rows.append((op, version, key, payload, before))

    def commit(self, scn: int, ts_ns: int, txid: bytes, origin: bytes | None
               ) -> tuple[bytes, int]:
        rows, self._rows = self._rows, []
        # the metadata part, Avro of METADATA_SCHEMA by hand: before, txid, file (null),
        # pos, gtid (the origin), server_id (null), row
        txid_to_pos = b"\x02" + long_bytes(len(txid)) + txid + b"\x00\x02" + long_bytes(scn)
        gtid = b"\x00" if origin is None else b"\x02" + long_bytes(len(origin)) + origin
        parts = []
        for row, (op, version, key, payload, before) in enumerate(rows):
            s = version.schema
            if op == ev.Op.TRUNCATE:
                parts.append(ev.encode(scn=scn, src_id=s.src_id, key=0, payload=b"",
                                       schema_id=s.id, schema_version=s.version, op=op,
                                       timestamp_ns=ts_ns))
                continue
            meta = (b"\x00" if before is None else b"\x02" + long_bytes(len(before)) + before
                    ) + txid_to_pos + gtid + b"\x00\x02" + long_bytes(row)
            parts.append(ev.encode(scn=scn, src_id=s.src_id, key=key, payload=payload,
                                   schema_id=s.id, schema_version=s.version, op=op,
                                   timestamp_ns=ts_ns, metadata=meta,
                                   metadata_schema_id=MetadataCodec.ID))
        return b"".join(parts), len(parts)

    def clear(self) -> None:
        self._rows = []


def _codec(version: TableVersion) -> Any:
    """The C codec of a version: one kind per column of the relation (the wire tuple),
    ``K_SKIP`` for a column the version leaves out; key columns by wire position."""
    s = version.schema
    kept = [_KINDS[str(a)] for a in version.avro_types]
    key_cols = tuple(version.key_index)
    if version.wire is None:
        kinds = bytes(kept)
    else:
        wire = [K_SKIP] * version.width
        for kind, at in zip(kept, version.wire, strict=True):
            wire[at] = kind
        kinds = bytes(wire)
        key_cols = tuple(version.wire[k] for k in key_cols)
    if not version.key_index:
        mode = KEY_ROWINDEX
    elif version.int_key:
        mode = KEY_INT
    else:
        mode = KEY_JSON
    return _pgcodec.Codec(kinds, key_cols, mode, s.src_id, s.id, s.version)


class CRows:
    """The compiled path (``_pgcodec.Decoder``); one codec per table version."""

    def __init__(self) -> None:
        assert _pgcodec is not None
        self._dec = _pgcodec.Decoder(MetadataCodec.ID)
        self._codecs: dict[int, Any] = {}  # id(version) -> its codec (versions live on)
        self._versions: list[TableVersion] = []

    def _codec_of(self, version: TableVersion) -> Any:
        c = self._codecs.get(id(version))
        if c is None:
            c = self._codecs[id(version)] = _codec(version)
            self._versions.append(version)  # keeps id() unique
        return c

    @property
    def pending(self) -> int:
        return int(self._dec.pending)

    def relate(self, oid: int, version: TableVersion | None) -> None:
        self._dec.relate(oid, None if version is None else self._codec_of(version))

    def forget(self, oid: int) -> None:
        """Changes of ``oid`` go to Python (the signal table)."""
        self._dec.forget(oid)

    def change(self, payload: bytes, skip: int) -> int:
        try:
            return int(self._dec.change(payload, skip))
        except ValueError:
            return -1  # decoded again in Python, which names what is wrong

    def add(self, version: TableVersion, op: ev.Op, key: int | bytes, payload: bytes,
            before: bytes | None) -> None:
        self._dec.add(self._codec_of(version), int(op), key, payload, before)

    def commit(self, scn: int, ts_ns: int, txid: bytes, origin: bytes | None
               ) -> tuple[bytes, int]:
        try:
            data, count = self._dec.commit(scn, ts_ns, txid, origin)
        except (ValueError, OverflowError) as exc:
            raise CorruptEventError(f"transaction at {scn} not encodable: {exc}") from exc
        return data, int(count)  # bytes made by the extension: no copy

    def clear(self) -> None:
        self._dec.clear()


def rows(compiled: bool | None) -> Rows:
    """The compiled rows when ``compiled`` is True, or None and the extension is built."""
    if compiled is None:
        compiled = available()
    if compiled and not available():
        raise ConfigError("the compiled pgoutput codec (_pgcodec) is not built: run"
                          " bash scripts/setup.sh, or leave compiled unset")
    return CRows() if compiled else PyRows()
