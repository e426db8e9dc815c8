"""MariaDB/MySQL binlog source (first cut; issue #3 continues it).

* **SCN** = ``(binlog file number << 32) | position after the transaction's
  commit event``; restarting at an SCN resumes the dump at that file and
  position, which is the first event after that transaction.
* **Window** = one transaction (GTID ... XID), multi-table transactions stay
  one window; timestamps come from the binlog.
* **Source ids** are stable: CRC-32 of ``db.table`` masked to 31 bits.
* **Schemas**: one Avro schema per table map shape (columns and types); the
  version number counts shapes seen by this process (the schema id, a digest,
  is what decoding relies on).
* ``after_scn = -1`` starts at the server's current binlog end.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
import threading
import time
import zlib
from typing import Any

from databus.core import event as ev
from databus.core.errors import DatabusError, SourceUnavailableError
from databus.core.schema import ColumnSpec, MetadataCodec, SchemaRegistry, TableSchema, table_schema
from databus.sources.base import Source, SourceInfo, Window
from databus.sources.mysql import events as be
from databus.sources.mysql import rows as br
from databus.sources.mysql.checks import check_server, parse_mysql_url
from databus.sources.mysql.connection import BinlogStream, master_status, server_facts

_OPS = {30: ev.Op.INSERT, 23: ev.Op.INSERT, 31: ev.Op.UPDATE, 24: ev.Op.UPDATE,
        32: ev.Op.DELETE, 25: ev.Op.DELETE}
_EPOCH = dt.datetime(1970, 1, 1)


def source_id(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def _avro_type(td: br.TableDef, i: int) -> Any:
    t, m = td.real_types[i], td.meta[i]
    if t in (br.T_TINY, br.T_SHORT, br.T_INT24, br.T_LONG, br.T_YEAR):
        return "long"
    if t == br.T_LONGLONG or (t == br.T_BIT and (m & 0xFF) >= 8):
        if td.unsigned[i] or t == br.T_BIT:  # 64-bit unsigned does not fit a long
            return {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 0}
        return "long"
    if t == br.T_BIT:
        return "long"
    if t == br.T_FLOAT:
        return "float"
    if t == br.T_DOUBLE:
        return "double"
    if t == br.T_NEWDECIMAL:
        return {"type": "bytes", "logicalType": "decimal", "precision": m >> 8,
                "scale": m & 0xFF}
    if t == br.T_DATE:
        return {"type": "int", "logicalType": "date"}
    if t == br.T_TIME2:
        return "long"  # microseconds, may be negative or beyond 24 h
    if t == br.T_DATETIME2:
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if t == br.T_TIMESTAMP2:
        return {"type": "long", "logicalType": "timestamp-micros"}
    if t in (br.T_ENUM, br.T_SET, br.T_JSON):
        return "string"
    if t in (br.T_VARCHAR, br.T_VAR_STRING, br.T_STRING, br.T_BLOB):
        cs = td.charsets[i] if td.charsets else 33
        return "bytes" if cs == br.BINARY_CHARSET else "string"
    return "bytes"


def _avro_value(v: Any, avro: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, dt.timedelta):
        return v // dt.timedelta(microseconds=1)
    if isinstance(avro, dict) and avro.get("logicalType") == "decimal" and isinstance(v, int):
        return decimal.Decimal(v)
    if avro == "string" and isinstance(v, bytes):
        return v.decode("utf-8", "surrogateescape")
    if avro == "bytes" and isinstance(v, str):
        return v.encode("utf-8", "surrogateescape")
    return v


class _Table:
    def __init__(self, td: br.TableDef, version: int) -> None:
        name = f"{td.schema}.{td.table}"
        self.src = source_id(name)
        self.types = [_avro_type(td, i) for i in range(len(td.types))]
        names = td.names or [f"col{i}" for i in range(len(td.types))]
        specs = [ColumnSpec(n, a, nullable=True) for n, a in zip(names, self.types, strict=True)]
        keys = tuple(names[i] for i in td.primary_key)
        self.schema = TableSchema(self.src, name, version, table_schema(td.schema, td.table, specs),
                                  keys)
        self.fields = [f["name"] for f in self.schema.avro["fields"]]
        self.key_idx = list(td.primary_key)

    def row(self, values: list[Any]) -> dict[str, Any]:
        return {f: _avro_value(v, a) for f, v, a in zip(self.fields, values, self.types,
                                                         strict=True)}

    def key(self, values: list[Any], index: int) -> int | bytes:
        kv = [values[i] for i in self.key_idx]
        if len(kv) == 1 and isinstance(kv[0], int) and -(1 << 63) <= kv[0] < 1 << 63:
            return kv[0]
        if not kv:  # no primary key: the row's position in its transaction
            return index
        return json.dumps([str(v) if not isinstance(v, (int, str)) else v for v in kv],
                          separators=(",", ":")).encode()


class MysqlSource(Source):
    """Captures tables matching ``tables`` (regexes on ``db.table``)."""

    def __init__(self, url: str, tables: list[str], *, server_id: int = 1_000_001,
                 heartbeat: float = 1.0) -> None:
        self.url = parse_mysql_url(url)
        check_server(server_facts(self.url))
        self._patterns = [re.compile(p) for p in (tables or [".*"])]
        self.server_id = server_id
        self.heartbeat = heartbeat
        self._registry = SchemaRegistry()
        self._meta = MetadataCodec()
        self._tables: dict[bytes, _Table] = {}  # by schema digest
        self._by_src: dict[int, SourceInfo] = {}
        self._versions: dict[int, int] = {}
        self._stream: BinlogStream | None = None
        self._stream_scn = -2
        self._file = ""
        self._base = ""
        self._reset_txn()

    def _reset_txn(self) -> None:
        self._maps: dict[int, br.TableDef] = {}
        self._parts: list[dict[str, Any]] = []
        self._gtid: str | None = None
        self._ts = 0

    def _wanted(self, name: str) -> bool:
        return any(p.fullmatch(name) for p in self._patterns)

    def sources(self) -> list[SourceInfo]:
        return sorted(self._by_src.values(), key=lambda s: s.id)

    def registry(self) -> SchemaRegistry:
        return self._registry

    def _open(self, after_scn: int) -> None:
        if self._stream is not None:
            self._stream.close()
        if after_scn < 0:
            file, pos = master_status(self.url)
        else:
            file, pos = self._file_name(after_scn >> 32), after_scn & 0xFFFFFFFF
        self._base = file.rsplit(".", 1)[0]
        self._file = file
        self._stream = BinlogStream(self.url, server_id=self.server_id, file=file, pos=pos,
                                    heartbeat=self.heartbeat, read_timeout=self.heartbeat * 5)
        self._stream_scn = after_scn
        self._reset_txn()

    def _file_name(self, number: int) -> str:
        base = self._base or master_status(self.url)[0].rsplit(".", 1)[0]
        return f"{base}.{number:06d}"

    def _scn(self, pos: int) -> int:
        return (int(self._file.rsplit(".", 1)[1]) << 32) | pos

    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        try:
            return self._read(after_scn, stop, timeout)
        except DatabusError:
            # the next read reopens the dump at the relay's position (a partly
            # read transaction is dropped and read again whole)
            self.close()
            raise

    def _read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        if self._stream is None or after_scn != self._stream_scn:
            self._open(after_scn)
        assert self._stream is not None
        deadline = time.monotonic() + timeout
        while not stop.is_set() and time.monotonic() < deadline:
            raw = self._stream.read()
            if raw is None:
                raise SourceUnavailableError("the server ended the binlog stream")
            window = self._event(raw)
            if window is not None:
                self._stream_scn = window.scn
                return [window]
        return []

    def _event(self, raw: bytes) -> Window | None:
        assert self._stream is not None
        h, body = be.parse_header(raw, self._stream.checksum)
        t = h.type
        if t == be.EventType.ROTATE:
            self._file = be.parse_rotate(body).file
        elif t == be.EventType.MARIADB_GTID:
            self._reset_txn()
            self._gtid = be.parse_mariadb_gtid(body).text(h.server_id)
            self._ts = h.timestamp
        elif t == be.EventType.TABLE_MAP:
            td = br.parse_table_def(body)
            self._maps[td.table_id] = td
        elif t in be.ROW_EVENTS:
            self._rows(t, body, h)
        elif t == be.EventType.XID or (t == be.EventType.QUERY
                                       and be.parse_query(body)[1].upper() == "COMMIT"):
            parts = self._parts
            self._reset_txn()
            if parts:  # events get their sequence once the commit position is known
                scn = self._scn(h.next_pos)
                data = b"".join(ev.encode(scn=scn, **p) for p in parts)
                return Window(scn, data, len(parts), h.timestamp * 1_000_000_000)
        return None

    def _table(self, td: br.TableDef) -> _Table:
        probe = _Table(td, 0)
        known = self._tables.get(probe.schema.id)
        if known is not None:
            return known
        version = self._versions.get(probe.src, 0) + 1
        self._versions[probe.src] = version
        table = _Table(td, version)
        self._tables[probe.schema.id] = table
        self._registry.add(table.schema)
        self._by_src[table.src] = SourceInfo(table.src, table.schema.name)
        return table

    def _rows(self, t: int, body: memoryview, h: be.EventHeader) -> None:
        td = self._maps.get(int.from_bytes(body[0:6], "little"))
        if td is None or not self._wanted(f"{td.schema}.{td.table}"):
            return
        table = self._table(td)
        for before, after in br.decode_rows(td, t, body):
            index = len(self._parts)
            image = after if after is not None else before
            assert image is not None
            meta: dict[str, Any] = {"file": self._file, "pos": h.next_pos, "gtid": self._gtid,
                                    "server_id": h.server_id, "row": index, "txid": self._gtid}
            if before is not None and after is not None:
                meta["before"] = table.schema.encode(table.row(before))
            self._parts.append({
                "src_id": table.src, "key": table.key(image, index),
                "payload": table.schema.encode(table.row(image)), "schema_id": table.schema.id,
                "schema_version": table.schema.version, "op": _OPS[t],
                "timestamp_ns": h.timestamp * 1_000_000_000, "metadata": self._meta.encode(meta),
                "metadata_schema_id": self._meta.id})

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
