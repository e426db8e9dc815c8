"""The ``databus`` source's offsets: what Spark writes to a query's offset log.

An offset is JSON, one Databus checkpoint per MOD bucket, stamped with what it was
read from::

    {"v": 1, "partitions": N, "relay": "http://relay:11115", "origin": "sqlite:...",
     "sources": ["main.customers"],
     "buckets": {"0": {"windowScn": S, "windowOffset": -1, "prevScn": P}, ...}}

* ``relay``: the relay option as the query gives it (a cluster address ``zk://...`` as
  is; a list of URLs sorted), without trailing ``/``;
* ``origin``: the ``Databus-Origin`` header of the relay's ``GET /sources`` (what the
  relay captures, the same for every relay or cluster member capturing one database);
  absent when the relay sends none;
* ``sources``: the query's sources as the relay names them (``db.table``), in the
  order the query asks for them.

The relay identity of an offset is its ``origin``, else its ``relay``. Reading a
checkpoint (:meth:`Identity.check`) refuses, with one :class:`ConfigError` naming
both, an offset written for other sources (as a set) or another relay: two origins
must be equal; when either side has none, the ``relay`` addresses must be. So a
checkpoint moves with its database between relays and across a cluster's failover,
and a checkpoint written before the relay sent an origin still resumes on the same
address. An offset without ``relay`` and ``sources`` (written before databus stamped
them) is accepted with a warning; the next offset the query writes carries them.
The buckets are unchanged, so every MOD-bucket checkpoint stays valid.

Micro-batches always end on a window boundary (``windowOffset = -1``), so every bucket
of an end offset holds the same ``windowScn``. The JVM reader (``Offsets.java``) writes
the same text byte for byte (``json.dumps``' separators, ASCII escapes), so a
checkpoint written by one reader resumes with the other.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from databus.core.checkpoint import Checkpoint
from databus.core.errors import ConfigError

log = logging.getLogger("databus.spark")

OFFSET_VERSION = 1


def relay_address(relay: str) -> str:
    """The ``relay`` option as an offset records it (see the module docstring)."""
    text = relay.strip()
    if text.startswith("zk://"):
        return text.rstrip("/")
    urls = sorted(u.strip().rstrip("/") for u in text.split(",") if u.strip())
    return ",".join(urls)


@dataclass(frozen=True)
class Identity:
    """What a query reads: the relay (address and origin) and its sources' names."""

    relay: str
    origin: str | None
    sources: tuple[str, ...]

    @property
    def name(self) -> str:
        """The relay identity: the origin, else the address."""
        return self.origin if self.origin is not None else self.relay

    def describe(self) -> str:
        who = f"relay {self.relay}" + (f" (origin {self.origin})" if self.origin else "")
        return f"{who}, sources {', '.join(self.sources)}"

    def check(self, offset: dict[str, Any]) -> None:
        """Refuse ``offset`` (from Spark's offset log) when it was written for another
        relay or other sources; accept an unstamped one with a warning."""
        if "relay" not in offset and "sources" not in offset:
            log.warning("databus source: the checkpoint's offset records no relay and no sources"
                        " (written before databus recorded them); accepted for %s, and the next"
                        " offset written records them", self.describe())
            return
        stored = Identity(str(offset.get("relay", "")),
                          str(offset["origin"]) if offset.get("origin") is not None else None,
                          tuple(str(s) for s in offset.get("sources") or ()))
        same_sources = sorted(set(stored.sources)) == sorted(set(self.sources))
        if stored.origin is not None and self.origin is not None:
            same_relay = stored.origin == self.origin
        else:
            same_relay = stored.relay == self.relay
        if not (same_sources and same_relay):
            raise ConfigError(
                f"databus source: this checkpoint was written for {stored.describe()}; this query"
                f" reads {self.describe()}: use the checkpointLocation of this query, or a new one")


def offset_of(scn: int, prev_scn: int, partitions: int,
              ident: Identity | None = None) -> dict[str, Any]:
    """The offset with every bucket after window ``scn`` (-1 = the relay's oldest),
    stamped with ``ident`` (an unstamped one without)."""
    cp = {"windowScn": scn, "windowOffset": -1, "prevScn": prev_scn}
    out: dict[str, Any] = {"v": OFFSET_VERSION, "partitions": partitions}
    if ident is not None:
        out["relay"] = ident.relay
        if ident.origin is not None:
            out["origin"] = ident.origin
        out["sources"] = list(ident.sources)
    out["buckets"] = {str(b): dict(cp) for b in range(partitions)}
    return out


def offset_scn(offset: dict[str, Any], partitions: int, ident: Identity | None = None) -> int:
    """The common window SCN of an offset; checks it belongs to this query (its shape, and
    with ``ident`` its relay and sources: :meth:`Identity.check`)."""
    if offset.get("v") != OFFSET_VERSION or not isinstance(offset.get("buckets"), dict):
        raise ConfigError(f"databus source: unreadable offset {offset!r} in the checkpoint")
    if ident is not None:
        ident.check(offset)
    if offset.get("partitions") != partitions:
        raise ConfigError(
            f"databus source: the checkpoint was written with partitions="
            f"{offset.get('partitions')}, the query now has partitions={partitions}; keep the "
            "number of partitions or start a new checkpointLocation")
    scns = {Checkpoint.from_dict(cp).window_scn for cp in offset["buckets"].values()}
    if len(scns) != 1:
        raise ConfigError(f"databus source: offset buckets disagree: {offset!r}")
    return scns.pop()
