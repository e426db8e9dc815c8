"""Server-side filters (Databus JSON), applied by relays and bootstrap servers.

Format::

    {"<srcId>": {"partitionType": "MOD" | "RANGE",
                 "filters": [{"numBuckets": N, "bktRange": {"start": a, "end": b}}
                             | {"keyRange": {"start": a, "end": b}}]}}

Ranges are half-open ``[start, end)``. For MOD, an event is kept when
``abs(key) % numBuckets`` falls in one of its bucket ranges; for RANGE when the
key falls in one of its key ranges. A source id not named in the filter is not
filtered. Control events are never filtered.

Keys that are bytes (string or composite keys) are first mapped to an integer
with :func:`key_hash`: the unsigned CRC-32 (IEEE 802.3, as ``zlib.crc32``) of
the key bytes. The function is part of the contract: it never changes.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

from databus.core import jsonsafe
from databus.core.errors import InvalidFilterError

MAX_FILTER_BYTES = 64 * 1024
MAX_RANGES = 1024
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1


def key_hash(key: int | bytes) -> int:
    """The integer a key is filtered by (stable across versions and machines)."""
    if isinstance(key, int):
        return key
    return zlib.crc32(key)


@dataclass(frozen=True, slots=True)
class SourceFilter:
    """The filter of one source: MOD buckets or key ranges, half-open."""

    partition_type: str  # "MOD" | "RANGE"
    num_buckets: int  # MOD only; 0 for RANGE
    ranges: tuple[tuple[int, int], ...]

    def matches(self, key: int | bytes) -> bool:
        value = key_hash(key)
        if self.partition_type == "MOD":
            value = abs(value) % self.num_buckets
        return any(start <= value < end for start, end in self.ranges)


@dataclass(frozen=True, slots=True)
class ServerFilter:
    """Filters by source id. ``matches`` is true for sources not named."""

    by_source: dict[int, SourceFilter]

    def matches(self, src_id: int, key: int | bytes) -> bool:
        f = self.by_source.get(src_id)
        return True if f is None else f.matches(key)

    def to_json(self) -> str:
        out: dict[str, Any] = {}
        for src, f in self.by_source.items():
            if f.partition_type == "MOD":
                items: list[dict[str, Any]] = [
                    {"numBuckets": f.num_buckets, "bktRange": {"start": a, "end": b}}
                    for a, b in f.ranges
                ]
            else:
                items = [{"keyRange": {"start": a, "end": b}} for a, b in f.ranges]
            out[str(src)] = {"partitionType": f.partition_type, "filters": items}
        return json.dumps(out, separators=(",", ":"), sort_keys=True)

    @classmethod
    def mod(cls, src_ids: list[int], num_buckets: int, start: int, end: int) -> ServerFilter:
        """Buckets ``[start, end)`` of ``num_buckets`` for each source."""
        f = SourceFilter("MOD", num_buckets, ((start, end),))
        return cls({s: f for s in src_ids})

    @classmethod
    def parse(cls, text: str | bytes) -> ServerFilter:
        """Parse and validate the Databus JSON; raises :class:`InvalidFilterError`."""
        raw = jsonsafe.loads_bounded(text, MAX_FILTER_BYTES, "filter", InvalidFilterError)
        if not isinstance(raw, dict):
            raise InvalidFilterError("filter must be a JSON object keyed by source id")
        by_source: dict[int, SourceFilter] = {}
        for src, spec in raw.items():
            try:
                src_id = int(src)
            except ValueError:
                raise InvalidFilterError(f"filter key {src!r} is not a source id") from None
            by_source[src_id] = _parse_source(src, spec)
        return cls(by_source)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not _I64_MIN <= value <= _I64_MAX:
        raise InvalidFilterError(f"{what} must be a 64-bit integer, got {value!r}")
    return value


def _range(obj: Any, what: str) -> tuple[int, int]:
    if not isinstance(obj, dict) or set(obj) != {"start", "end"}:
        raise InvalidFilterError(f"{what} must be {{\"start\": a, \"end\": b}}")
    start, end = _int(obj["start"], f"{what}.start"), _int(obj["end"], f"{what}.end")
    if start >= end:
        raise InvalidFilterError(f"{what}: start {start} must be below end {end} (half-open)")
    return start, end


def _parse_source(src: str, spec: Any) -> SourceFilter:
    where = f"filter for source {src}"
    if not isinstance(spec, dict):
        raise InvalidFilterError(f"{where} must be an object")
    ptype = spec.get("partitionType")
    items = spec.get("filters")
    if ptype not in ("MOD", "RANGE"):
        raise InvalidFilterError(f"{where}: partitionType must be MOD or RANGE, got {ptype!r}")
    if not isinstance(items, list) or not items:
        raise InvalidFilterError(f"{where}: filters must be a non-empty list")
    if len(items) > MAX_RANGES:
        raise InvalidFilterError(f"{where}: more than {MAX_RANGES} ranges")
    ranges: list[tuple[int, int]] = []
    num_buckets = 0
    for item in items:
        if not isinstance(item, dict):
            raise InvalidFilterError(f"{where}: each filter must be an object")
        if ptype == "MOD":
            n = _int(item.get("numBuckets"), f"{where}: numBuckets")
            if n <= 0:
                raise InvalidFilterError(f"{where}: numBuckets must be positive")
            if num_buckets and n != num_buckets:
                raise InvalidFilterError(f"{where}: all ranges must use the same numBuckets")
            num_buckets = n
            start, end = _range(item.get("bktRange"), f"{where}: bktRange")
            if start < 0 or end > n:
                raise InvalidFilterError(f"{where}: bktRange must lie within [0, {n}]")
        else:
            start, end = _range(item.get("keyRange"), f"{where}: keyRange")
        ranges.append((start, end))
    return SourceFilter(ptype, num_buckets, tuple(ranges))
