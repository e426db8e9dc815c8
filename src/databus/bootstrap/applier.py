"""The applier: folds the bootstrap log into the snapshot, in SCN order.

For each window after ``applied_scn`` (a batch of up to ``batch_windows`` at a
time): insert / update / snapshot read -> the key's row becomes this image
(stored as an op READ event with the snapshot attribute, without the before
image), delete -> the key's row is removed, truncate -> every row of the
source is removed. A batch is collapsed to the last operation per key (what
applying them in order would leave) and written with the new ``applied_scn``
in one store transaction, so a crash never applies part of a batch.

Retention: with ``retention`` (seconds), every ``trim_interval`` the windows
stored longer ago than that and already folded are deleted from the log and
the log's start moves up (see :meth:`BootstrapStore.trim`).

Key changes: a source may send a change of key as a delete of the old key and
an insert of the new one (the SQLite source does), or as one update carrying
the before image (MariaDB): then the old key's row is removed too
(:class:`KeyChanges`), for integer keys and for keys that are a JSON array of
the key columns' values (composite and non-integer keys of the MariaDB
source). A key change whose old event key cannot be derived that way is
logged and leaves the old row in the snapshot (a limit).

Concurrency model: one thread (:meth:`Applier.run`); stop it with the event.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from databus.bootstrap.store import BootstrapStore, key_bytes
from databus.core import event as ev
from databus.core.errors import DatabusError, SchemaError, TransientError
from databus.core.schema import MetadataCodec, SchemaRegistry, TableSchema

log = logging.getLogger("databus.bootstrap.applier")


class KeyChanges:
    """Finds updates that changed a row's key (sources that send a primary-key change
    as one update with the before image, e.g. MariaDB).

    The old event key is derived from the before image in the event key's own
    form: an integer key from a single integer column; a JSON-array key
    (``[v1,v2]``, compact) by replacing the changed columns' values, only when
    the new key re-encodes to exactly ``e.key`` and each changed value is a
    string or integer (so the JSON form is the value itself). Anything else is
    logged, and the snapshot keeps the old key's row (see the module docstring).
    """

    def __init__(self, store: BootstrapStore | None) -> None:
        self.store = store
        self.registry = SchemaRegistry()
        self.meta = MetadataCodec()
        self._warned: set[int] = set()

    def _schema(self, e: ev.Event) -> TableSchema | None:
        schema = self.registry.find(e.schema_id)
        if schema is None and self.store is not None:
            raw = self.store.get("registry")
            if raw is not None:
                self.registry = SchemaRegistry.from_json(raw)
                schema = self.registry.find(e.schema_id)
        return schema

    def old_key(self, e: ev.Event) -> int | bytes | None:
        """The key the row had before update ``e`` when it changed, else None."""
        if e.metadata is None or not e.schema_id:
            return None
        before_raw = self.meta.decode(e.metadata).get("before")
        if before_raw is None:
            return None
        schema = self._schema(e)
        if schema is None or not schema.key_columns:
            return None
        fields = {f.get("column", f["name"]): f["name"] for f in schema.avro["fields"]}
        try:
            before, after = schema.decode(before_raw), schema.decode(e.payload)
        except SchemaError as exc:  # a row that does not decode: folded by its own key
            log.warning("update at scn %d of %s: images do not decode (%s)", e.scn,
                        schema.name, exc)
            return None
        old = [before.get(fields.get(k, k)) for k in schema.key_columns]
        new = [after.get(fields.get(k, k)) for k in schema.key_columns]
        if old == new:
            return None
        if isinstance(e.key, int):
            if len(old) == 1 and isinstance(old[0], int) and not isinstance(old[0], bool):
                return old[0]
        else:
            rekeyed = _json_old_key(e.key, old, new)
            if rekeyed is not None:
                return rekeyed
        if e.src_id not in self._warned:
            self._warned.add(e.src_id)
            log.warning("source %s changed a key in one update (scn %d) whose old event key "
                        "cannot be derived; the snapshot keeps the old key's row",
                        schema.name, e.scn)
        return None


def _json_dump(values: list[Any]) -> bytes:
    return json.dumps(values, ensure_ascii=False, separators=(",", ":")).encode()


def _json_old_key(key: bytes, old: list[Any], new: list[Any]) -> bytes | None:
    """The JSON-array event key of the before image, or None when ``key`` is not
    the compact JSON array of ``new``'s values in a form this can reproduce."""
    try:
        parts = json.loads(key)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(parts, list) or len(parts) != len(new) or _json_dump(parts) != key:
        return None
    out: list[Any] = []
    for part, was, now in zip(parts, old, new, strict=True):
        if was == now:
            out.append(part)
            continue
        plain = (str, int)
        if (not isinstance(was, plain) or isinstance(was, bool) or not isinstance(now, plain)
                or isinstance(now, bool) or part != now):
            return None
        out.append(was)
    return _json_dump(out)


def collapse(windows: list[tuple[int, bytes]], keys: KeyChanges | None = None
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
    """(upserts, deletes, truncated sources) that leave the snapshot as applying
    ``windows`` in order would.

    A truncation inside the batch is applied first by the store, so operations
    on that source before it are dropped here. With ``keys``, an update that
    changed the key also removes the old key's row.
    """
    last: dict[tuple[int, bytes], tuple[int, bytes | None]] = {}
    truncated: list[int] = []
    for _scn, data in windows:
        for e in ev.iter_events(data):
            if e.is_control:
                continue
            op = e.op
            if op == ev.Op.TRUNCATE:
                for k in [k for k in last if k[0] == e.src_id]:
                    del last[k]
                if e.src_id not in truncated:
                    truncated.append(e.src_id)
                continue
            if op == ev.Op.UPDATE and keys is not None:
                old = keys.old_key(e)
                if old is not None:
                    last[(e.src_id, key_bytes(old))] = (e.scn, None)
            k = (e.src_id, key_bytes(e.key))
            if op == ev.Op.DELETE:
                last[k] = (e.scn, None)
            else:
                last[k] = (e.scn, ev.encode(
                    scn=e.scn, src_id=e.src_id, key=e.key, payload=e.payload,
                    schema_id=e.schema_id, schema_version=e.schema_version, op=ev.Op.READ,
                    timestamp_ns=e.timestamp_ns, partition=e.partition,
                    extra_attributes=ev.ATTR_SNAPSHOT))
    upserts = [{"src": s, "k": k, "scn": scn, "ev": image}
               for (s, k), (scn, image) in last.items() if image is not None]
    deletes = [{"src": s, "k": k} for (s, k), (_scn, image) in last.items() if image is None]
    return upserts, deletes, truncated


class Applier:
    """Keeps the snapshot of ``store`` up to date with its log."""

    def __init__(self, store: BootstrapStore, *, batch_windows: int = 500,
                 poll_interval: float = 0.2, retry_max: float = 10.0,
                 retention: float | None = None, trim_interval: float = 60.0) -> None:
        self.store = store
        self.retention = retention
        self.trim_interval = trim_interval
        self.keys = KeyChanges(store)
        self._next_trim = time.monotonic()
        self.batch_windows = batch_windows
        self.poll_interval = poll_interval
        self.retry_max = retry_max
        self.applied_scn = -1
        self.windows = 0
        self.error: str | None = None
        self.state = "running"  # "retrying" (a transient error), "failed" (a terminal one)

    def step(self) -> int:
        """Apply one batch; the number of windows applied (0 = nothing new)."""
        state = self.store.state()
        if not state.initialized:
            return 0
        windows = self.store.log_after(state.applied_scn, self.batch_windows)
        if not windows:
            self.applied_scn = state.applied_scn
            return 0
        upserts, deletes, truncated = collapse(windows, self.keys)
        self.store.fold(upserts, deletes, truncated, windows[-1][0])
        self.applied_scn = windows[-1][0]
        self.windows += len(windows)
        return len(windows)

    def trim(self) -> int | None:
        """Drop log windows older than the retention that are folded into the snapshot."""
        if self.retention is None:
            return None
        start = self.store.trim(time.time_ns() - int(self.retention * 1e9),
                                self.store.state().applied_scn)
        if start is not None:
            log.info("bootstrap log trimmed: it now starts after SCN %d", start)
        return start

    def run(self, stop: threading.Event) -> None:
        """Apply until ``stop`` is set; transient store errors are retried with backoff."""
        delay = self.poll_interval
        while not stop.is_set():
            try:
                n = self.step()
                if self.retention is not None and time.monotonic() >= self._next_trim:
                    self._next_trim = time.monotonic() + self.trim_interval
                    self.trim()
                self.error = None
                self.state = "running"
                delay = self.poll_interval
            except TransientError as exc:
                self.error = str(exc)
                self.state = "retrying"
                log.warning("applier: %s; retrying in %.1fs", exc, delay)
                stop.wait(delay)
                delay = min(delay * 2, self.retry_max)
                continue
            except DatabusError as exc:
                self.error = str(exc)
                self.state = "failed"
                log.error("applier stopped: %s", exc)
                raise
            if n == 0:
                stop.wait(self.poll_interval)
