"""The bootstrap server's HTTP API (Starlette), docs/bootstrap.md.

Endpoints (errors are JSON ``{"error": <code>, "message": ...}`` with a 4xx
for a client's mistake, answered by the handlers of :mod:`databus.serving`;
nothing a client sends can stop the server). Every endpoint is a plain
function: Starlette runs it in its thread pool, so store reads and event
filtering never block the event loop.

* ``GET /sources``, ``GET /register?sources=..``: copies of the relay's.
* ``GET /startSCN?sources=..&checkPoint=<online checkpoint>``: where a
  bootstrap of this consumer starts; answers ``{"startScn": S, "checkpoint":
  {...}}``, the bootstrap checkpoint to send to ``/bootstrap``. Without a
  checkpoint (a new consumer), or when the log does not reach back to the
  consumer's SCN, it is a snapshot bootstrap (``BOOTSTRAP_SNAPSHOT``,
  S = applied position + 1); when the log holds every window after the
  consumer's SCN X, it is a catch-up only (``BOOTSTRAP_CATCHUP``, S = X + 1).
  ``snapshotRows``: the snapshot's rows now (for progress reports; rows
  changed after S are not sent, so the consumer may receive fewer). With
  ``idSpan=true`` a snapshot answer also holds ``snapshotIdSpan``: ``[lowest,
  highest]`` row id of the sources' rows with scn < S (``[0, -1]`` when none), for
  readers that split the snapshot into id ranges (``snapshotEnd`` below).
* ``GET /targetSCN``: ``{"targetScn": T}``, the newest SCN in the log.
* ``GET /bootstrap?sources=..&checkPoint=..&batchSize=..&filters=..``: the next
  batch after the checkpoint, binary events followed by one CHECKPOINT
  control event (source id -3) whose payload is the checkpoint to send next.

  - Snapshot phase: rows of the snapshot store with scn < S, source by source
    (in id order), in row id order, at most ``batchSize`` rows before the
    filter (``snapshot_source``, ``snapshot_offset`` = last row id read).
    ``snapshotEnd=N`` (no filter): only rows with id <= N; a source is done when
    none is left up to N (a reader of the id range ``(snapshot_offset, N]``, e.g.
    one Spark partition of ``format("databus-snapshot")``, asks for one source
    at a time, each starting at the range's first id). Without
    a filter the answer is the stored events as the store concatenated them
    (:meth:`BootstrapStore.snapshot_chunks`); with one, each row's key is
    checked. When the
    last source is done the next checkpoint is ``BOOTSTRAP_CATCHUP`` with
    ``bootstrap_target_scn`` = the newest SCN in the log.
  - Catch-up phase: whole windows (events + EOP) with S <= scn <= T and
    scn > ``windowScn``, at least one window, up to ``batchSize`` events.
    After window T the next checkpoint is the online checkpoint "after T":
    the consumer switches to the relay.

  MOD/RANGE filters (``filters``) and ``sources`` apply to both phases.

Typed errors: ``BootstrapTooYoung`` (410) when the log does not reach back to
S; ``BootstrapTooOld`` (409, retry later) when the store has not reached the
requested SCN; ``InvalidCheckpoint``/``InvalidRequest``/``InvalidFilter``
(400), ``UnknownSource`` (404).

Why it is consistent: a snapshot row with scn < S, read when the applier has
passed S - 1, is the key's image as of S - 1, or the key changed at or after S
and that change is in the catch-up. So snapshot + catch-up, applied in order,
leave every key as of T.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from databus.bootstrap.openapi import bootstrap_openapi
from databus.bootstrap.store import BootstrapStore, StoreState
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint, ConsumptionMode
from databus.core.errors import (
    BootstrapTooOldError,
    BootstrapTooYoungError,
    InvalidCheckpointError,
    InvalidRequestError,
    UnknownSourceError,
)
from databus.core.filters import ServerFilter
from databus.core.schema import SchemaRegistry
from databus.serving.errors import EXCEPTION_HANDLERS
from databus.serving.guard import principal, readable_ids
from databus.serving.health import Check, health_routes
from databus.serving.params import bool_param, int_param, source_ids_param
from databus.serving.ui import ui_route

MAX_BATCH = 1_000_000
NO_END = (1 << 63) - 1  # snapshotEnd's default: no upper row id
_CATCHUP_WINDOWS = 2000  # windows read from the store per catch-up query


class BootstrapServer:
    """What the HTTP handlers run (blocking calls; the app runs them in a thread pool)."""

    def __init__(self, store: BootstrapStore, default_batch: int = 10_000,
                 status: Callable[[], dict[str, Any]] | None = None) -> None:
        self.store = store
        self.default_batch = default_batch
        self.status = status or (lambda: {})

    # -- sources and schemas -----------------------------------------------------

    def sources(self) -> list[tuple[int, str]]:
        """The relay's sources as the producer copied them.

        Until the producer has copied them nothing is served (a snapshot over
        "no sources" would silently skip every row).
        """
        raw = self.store.get("sources")
        if raw is None:
            raise BootstrapTooOldError("the bootstrap store does not know the relay's sources "
                                       "yet (its producer has not reached the relay)")
        return sorted((int(s["id"]), str(s["name"])) for s in json.loads(raw))

    def registry(self) -> SchemaRegistry:
        raw = self.store.get("registry")
        return SchemaRegistry.from_json(raw) if raw is not None else SchemaRegistry()

    def requested(self, request: Request) -> list[tuple[int, str]]:
        """The sources a request names (``sources=``), or all its token may read;
        403 for a named one it may not."""
        served = self.sources()
        ids = readable_ids(request, served, source_ids_param(request, {sid for sid, _ in served}))
        return served if ids is None else [(sid, name) for sid, name in served if sid in ids]

    def _filter(self, request: Request, srcs: list[tuple[int, str]]) -> ServerFilter | None:
        raw = request.query_params.get("filters")
        if not raw:
            return None
        filt = ServerFilter.parse(raw)
        readable_ids(request, self.sources(), frozenset(filt.by_source))  # 403 before 404
        unknown = set(filt.by_source) - {s for s, _ in srcs}  # srcs: readable ones only
        if unknown:
            raise UnknownSourceError(f"filter names unknown source ids {sorted(unknown)}")
        return filt

    @staticmethod
    def _checkpoint(request: Request, required: bool) -> Checkpoint:
        raw = request.query_params.get("checkPoint")
        if not raw:
            if required:
                raise InvalidCheckpointError("checkPoint is required")
            return Checkpoint.flexible()
        return Checkpoint.from_json(raw)

    def _state(self) -> StoreState:
        st = self.store.state()
        if not st.initialized:
            raise BootstrapTooOldError("the bootstrap store has not been initialised yet "
                                       "(initial load or first window still to come)")
        return st

    # -- endpoints -------------------------------------------------------------------

    def start_scn(self, request: Request) -> dict[str, Any]:
        srcs = self.requested(request)
        cp = self._checkpoint(request, required=False)
        if cp.consumption_mode != ConsumptionMode.ONLINE_CONSUMPTION:
            raise InvalidCheckpointError(
                "/startSCN takes the consumer's online checkpoint (or none), got "
                f"{cp.consumption_mode.value}")
        st = self._state()
        since = -1 if cp.is_flexible else (cp.prev_scn if cp.in_window else cp.window_scn)
        names = ",".join(n for _, n in srcs)
        if since > st.log_max_scn:
            raise BootstrapTooOldError(
                f"the consumer is at SCN {since} but the bootstrap store only reached "
                f"{st.log_max_scn}")
        if since >= 0 and since >= st.log_start_scn:
            start = since + 1
            out = Checkpoint(consumption_mode=ConsumptionMode.BOOTSTRAP_CATCHUP,
                             bootstrap_since_scn=since, bootstrap_start_scn=start,
                             bootstrap_target_scn=st.log_max_scn, catchup_source=names)
        else:
            start = st.applied_scn + 1
            out = Checkpoint(consumption_mode=ConsumptionMode.BOOTSTRAP_SNAPSHOT,
                             bootstrap_since_scn=since, bootstrap_start_scn=start,
                             snapshot_source=srcs[0][1] if srcs else None)
        snapshot = out.consumption_mode == ConsumptionMode.BOOTSTRAP_SNAPSHOT
        ids = [s for s, _ in srcs]
        answer: dict[str, Any] = {"startScn": start, "checkpoint": out.to_dict(),
                                  "snapshotRows": self.store.count_snapshot(ids) if snapshot else 0}
        if snapshot and bool_param(request, "idSpan"):
            answer["snapshotIdSpan"] = list(self.store.snapshot_id_span(ids, start - 1)
                                            if ids else (0, -1))
        return answer

    def target_scn(self) -> dict[str, Any]:
        return {"targetScn": self._state().log_max_scn}

    def bootstrap(self, request: Request) -> bytes:
        srcs = self.requested(request)
        filt = self._filter(request, srcs)
        batch = int_param(request, "batchSize", self.default_batch, 1, MAX_BATCH)
        end = int_param(request, "snapshotEnd", NO_END, -1, NO_END)
        if end != NO_END and filt is not None:
            raise InvalidRequestError("snapshotEnd cannot be combined with filters")
        cp = self._checkpoint(request, required=True)
        st = self._state()
        start = cp.bootstrap_start_scn
        if cp.consumption_mode == ConsumptionMode.ONLINE_CONSUMPTION:
            raise InvalidCheckpointError("/bootstrap needs a BOOTSTRAP_SNAPSHOT or "
                                         "BOOTSTRAP_CATCHUP checkpoint (from /startSCN)")
        if start < 0:
            raise InvalidCheckpointError("bootstrap_start_scn is missing")
        if start - 1 < st.log_start_scn:
            raise BootstrapTooYoungError(
                f"the bootstrap log starts after SCN {st.log_start_scn}; it cannot serve a "
                f"bootstrap from SCN {start}: start the bootstrap again")
        if cp.consumption_mode == ConsumptionMode.BOOTSTRAP_SNAPSHOT:
            return self._snapshot(cp, st, srcs, filt, batch, end)
        return self._catchup(cp, st, srcs, filt, batch)

    def _snapshot(self, cp: Checkpoint, st: StoreState, srcs: list[tuple[int, str]],
                  filt: ServerFilter | None, batch: int, end: int = NO_END) -> bytes:
        start = cp.bootstrap_start_scn
        if start - 1 > st.applied_scn:
            raise BootstrapTooOldError(f"the snapshot is at SCN {st.applied_scn}, the "
                                       f"checkpoint needs {start - 1}")
        names = [n for _, n in srcs]
        if cp.snapshot_source is None and srcs:
            raise InvalidCheckpointError("snapshot_source is missing")
        if srcs and cp.snapshot_source not in names:
            raise UnknownSourceError(
                f"snapshot_source {cp.snapshot_source!r} is not among the requested sources "
                f"{names}")
        i = names.index(cp.snapshot_source) if srcs and cp.snapshot_source else 0
        offset = cp.snapshot_offset
        parts: list[bytes] = []
        while i < len(srcs):
            src = srcs[i][0]
            if filt is None:
                # the stored events as the database concatenated them: no per-row work
                parts, last, n = self.store.snapshot_chunks(src, offset, start, batch, end)
            else:
                rows, last = self.store.snapshot_batch(src, offset, start, batch)
                n = len(rows)
                parts = [r for r in rows if filt.matches(src, ev.peek_key(r))]
            if n:
                nxt = cp.model_copy(update={"snapshot_source": srcs[i][1],
                                            "snapshot_offset": last})
                return _with_checkpoint(parts, nxt, start)
            i += 1
            offset = -1
        # every source done: catch-up to the newest SCN in the log
        nxt = Checkpoint(consumption_mode=ConsumptionMode.BOOTSTRAP_CATCHUP,
                         bootstrap_since_scn=cp.bootstrap_since_scn, bootstrap_start_scn=start,
                         bootstrap_target_scn=max(st.log_max_scn, start - 1),
                         catchup_source=",".join(names))
        return _with_checkpoint(parts, nxt, start)

    def _catchup(self, cp: Checkpoint, st: StoreState, srcs: list[tuple[int, str]],
                 filt: ServerFilter | None, batch: int) -> bytes:
        target = cp.bootstrap_target_scn
        if target < cp.bootstrap_start_scn - 1:
            raise InvalidCheckpointError("bootstrap_target_scn is below bootstrap_start_scn")
        if target > st.log_max_scn:
            raise BootstrapTooOldError(f"the bootstrap log reached SCN {st.log_max_scn}, the "
                                       f"checkpoint's target is {target}")
        after = max(cp.bootstrap_start_scn - 1, cp.window_scn)
        wanted = {s for s, _ in srcs}
        parts: list[bytes] = []
        events = 0
        last = after
        while events < batch and last < target:
            windows = self.store.log_after(last, _CATCHUP_WINDOWS, upto_scn=target)
            if not windows:
                last = target
                break
            for scn, data in windows:
                events += _filtered(data, wanted, filt, parts)
                last = scn
                if events >= batch:
                    break
        if last >= target:
            nxt = Checkpoint.after(target)
        else:
            nxt = cp.model_copy(update={"window_scn": last, "window_offset": -1})
        return _with_checkpoint(parts, nxt, last)


def _filtered(data: bytes, wanted: set[int], filt: ServerFilter | None,
              out: list[bytes]) -> int:
    """Append the events of one stored window that pass; returns data events kept."""
    off, end, kept = 0, len(data), 0
    mv = memoryview(data)
    while off < end:
        size = ev.peek_length(data, off)
        src = ev.peek_src_id(data, off)
        if src == ev.SRC_EOP:
            out.append(bytes(mv[off:off + size]))
        elif src < 0:
            pass  # other control events stay here: a CHECKPOINT one means "next position"
        elif src in wanted and (filt is None or filt.matches(src, ev.peek_key(data, off))):
            out.append(bytes(mv[off:off + size]))
            kept += 1
        off += size
    return kept


def _with_checkpoint(parts: list[bytes], cp: Checkpoint, scn: int) -> bytes:
    parts.append(ev.encode_control(max(scn, 0), ev.SRC_CHECKPOINT, cp.to_json().encode()))
    return b"".join(parts)


def build_app(server: BootstrapServer, metrics: Callable[[], bytes] | None = None,
              ready: Callable[[], list[Check]] | None = None) -> Starlette:
    """The ASGI app of a bootstrap server; ``metrics``: its ``/metrics`` text, ``ready``:
    its readiness checks (docs/operations.md)."""

    def sources(request: Request) -> Response:
        who = principal(request)
        return JSONResponse([{"id": i, "name": n} for i, n in server.sources()
                             if who.may_read(n)])

    def register(request: Request) -> Response:
        ids = [s for s, _ in server.requested(request)]
        reg = server.registry()
        missing = sorted(set(ids) - set(reg.source_ids()))
        if missing:  # listed before its schemas were stored (a store an older producer wrote)
            raise BootstrapTooOldError(f"the bootstrap store has no schemas of source ids "
                                       f"{missing} yet (its producer is storing them)")
        return Response(reg.to_json(ids), media_type="application/json")

    def start_scn(request: Request) -> Response:
        return JSONResponse(server.start_scn(request))

    def target_scn(_: Request) -> Response:
        return JSONResponse(server.target_scn())

    def bootstrap(request: Request) -> Response:
        return Response(server.bootstrap(request), media_type="application/octet-stream")

    def admin(_: Request) -> Response:
        st = server.store.state()
        return JSONResponse({"status": "ok", "log_start_scn": st.log_start_scn,
                             "log_max_scn": st.log_max_scn, "applied_scn": st.applied_scn,
                             **server.status()})

    document = bootstrap_openapi(MAX_BATCH)

    def openapi(_: Request) -> Response:
        return JSONResponse(document)

    def metrics_endpoint(_: Request) -> Response:
        return Response(metrics() if metrics is not None else b"",
                        media_type="text/plain; version=0.0.4")

    routes = [Route("/openapi.json", openapi), Route("/sources", sources), Route("/register", register),
              Route("/startSCN", start_scn), Route("/targetSCN", target_scn),
              Route("/bootstrap", bootstrap), Route("/admin", admin),
              Route("/metrics", metrics_endpoint), ui_route("bootstrap"),
              *health_routes("bootstrap", ready if ready is not None else list)]
    return Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS)
