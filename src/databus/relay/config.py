"""Relay configuration: validated models and the one loader.

A YAML (or JSON) file maps onto :class:`RelayConfig`; every field has a
default except the source. Example (``docs/relay.md`` has the full reference)::

    name: shop-relay        # default: derived from the source and buffer
    source:
      url: sqlite:///shop.db
      tables: [orders, customers]
    buffer:
      capacity_bytes: 1073741824
      path: /var/lib/databus/relay.buf
    http:
      port: 11115
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from databus.coord import ZkAddress
from databus.core.access import RelayCredentials
from databus.core.config import FrozenModel, load_file, validate
from databus.core.errors import ConfigError
from databus.serving.config import HttpServerConfig
from databus.sources.config import AnySourceConfig, SnapshotMode, SourceConfig, legacy_tls

__all__ = ["AnySourceConfig", "BufferConfig", "ClusterConfig", "ConsumersConfig", "RelayConfig",
           "RelayHttpConfig", "SnapshotMode", "SourceConfig", "StreamConfig", "load_config",
           "parse_config"]

_Model = FrozenModel


class BufferConfig(_Model):
    """The event buffer."""

    capacity_bytes: int = Field(
        1024 * 1024 * 1024, ge=64 * 1024, description="bytes of events held: minutes of a"
        " busy source (about 400 bytes per row change of a small row; see docs/client.md,"
        " Sizing the relay's buffer). Memory is taken as the buffer fills, a buffer file is"
        " sparse; an existing buffer file keeps its own capacity unless this is given")
    path: Path | None = Field(
        None, description="file for a persistent (mmap) buffer recovered on restart; None = memory"
    )
    index_block: int = Field(16 * 1024, ge=512, description="bytes per sparse SCN index entry")
    flush_interval: float = Field(
        1.0, gt=0, le=3600, description="seconds between buffer flushes and state writes"
    )
    recover: bool = Field(
        False, description="a persistent buffer whose windows fail validation keeps its valid"
        " prefix and reads the rest again from the source; false = refuse to start")
    min_span_seconds: float = Field(
        300.0, ge=0, description="warn (log, and the gauge databus_relay_buffer_span_short)"
        " while the full buffer holds less source time than this: consumers stopped for"
        " longer fall off; 0 = no warning")


class RelayHttpConfig(HttpServerConfig):
    """The relay's listener, tokens, TLS and limits (:class:`databus.serving.HttpServerConfig`)."""

    port: int = Field(11115, ge=0, le=65535, description="0 picks a free port")


class StreamConfig(_Model):
    """Limits of /stream requests."""

    default_size: int = Field(1024 * 1024, ge=1024, description="bytes per response by default")
    max_size: int = Field(64 * 1024 * 1024, ge=1024, description="largest allowed size")
    default_timeout: float = Field(5.0, ge=0, description="long-poll seconds by default")
    max_timeout: float = Field(60.0, ge=0, description="longest allowed long-poll")
    max_inflight_bytes: int = Field(
        64 * 1024 * 1024, ge=1024 * 1024,
        description="answer bytes held for clients at once; when exceeded, new answers"
        " shrink (down to 64 KiB each), so clients that read slowly or not at all cannot"
        " make the relay's memory grow with their number")


class ConsumersConfig(_Model):
    """What the relay keeps of the consumers it served (``GET /consumers``,
    docs/operations.md)."""

    max_listed: int = Field(1000, ge=1, le=100_000, description="consumers listed at most;"
                            " a new one beyond that pushes out the one seen longest ago")
    stalled_after: float = Field(
        30.0, gt=0, le=86_400, description="seconds without a request, after its last long"
        " poll ended, after which a consumer is listed as stalled")
    gone_after: float = Field(300.0, gt=0, le=86_400, description="seconds without a request"
                              " after which a consumer is listed as gone")
    forget_after: float = Field(3600.0, gt=0, le=30 * 86_400, description="seconds without a"
                                " request after which a consumer is no longer listed")
    fall_off_warning: float = Field(
        60.0, ge=0, le=86_400, description="a consumer behind whose position is less than"
        " this many seconds of source time ahead of the buffer's oldest window, while the"
        " buffer evicts, is listed as falling off (0: never)")

    @model_validator(mode="after")
    def _order(self) -> ConsumersConfig:
        if not self.stalled_after <= self.gone_after <= self.forget_after:
            raise ValueError("consumers: stalled_after <= gone_after <= forget_after")
        return self


class ClusterConfig(RelayCredentials):
    """The ``cluster:`` section of a relay's config. Its credentials
    (:class:`~databus.core.access.RelayCredentials`: ``token_file``, ``ca_file``,
    ``cert_file``, ``key_file``) are what a follower presents to its leader (default:
    DATABUS_TOKEN / DATABUS_TOKEN_FILE, DATABUS_CA_FILE, ...); a token is needed when the
    members run with tokens."""

    address: str = Field(description="zk://HOST:PORT[,HOST:PORT...]/NAME")
    member_id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+$",
        description="this member's name in the cluster (default: HOST-PID)")
    advertise_url: str | None = Field(
        None, description="URL other members and clients reach this relay at (default: the"
        " URL it listens on)")
    session_timeout: float = Field(
        4.0, ge=2, le=120, description="ZooKeeper session timeout, s: how long a silent"
        " leader keeps its role; it bounds the failover time (a pause longer than this, GC"
        " or network, costs a failover). ZooKeeper grants 2 to 20 ticks (tickTime 2 s by"
        " default: 4 s to 40 s)")
    upstream_timeout: float | None = Field(
        None, ge=1, le=3600, description="seconds a follower's request to its leader may go"
        " without an answer beyond its long poll (and to connect) before the leader counts"
        " as lost: capture shows retrying, /health/ready 503, and it retries (a leader cut"
        " off silently is noticed within it); default: session_timeout")
    leaders: int = Field(
        1, ge=1, le=16, description="members that capture from the database at once: the"
        " primary (elected) and leaders-1 co-leaders (leases taken by caught-up followers);"
        " every window is the same on each (SQLite: window_cuts shared). leaders > 1 needs"
        " snapshot_mode initial or no_data")
    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, raw: Any) -> Any:
        return legacy_tls(raw, "cluster") if isinstance(raw, dict) else raw

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        try:
            ZkAddress.parse(v)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return v

    def zk_address(self) -> ZkAddress:
        return ZkAddress.parse(self.address)

    def follower_timeout(self) -> float:
        """A follower's deadline on its leader beyond the long poll (upstream_timeout)."""
        return self.upstream_timeout if self.upstream_timeout is not None \
            else self.session_timeout


class RelayConfig(_Model):
    """Everything a relay needs."""

    name: str | None = Field(
        None, min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$",
        description="this relay's name: its state files, the PostgreSQL slot and publication,"
        " the SQLite trim registration and the MySQL server_id derive from it; default:"
        " derived from the source and the buffer file (<buffer stem>-<6 hex>; see"
        " docs/relay.md, Identity)")
    source: SourceConfig = Field(description="what to capture: the model of the kind of"
                                 " source its url names")
    buffer: BufferConfig = BufferConfig()
    http: RelayHttpConfig = RelayHttpConfig()
    stream: StreamConfig = StreamConfig()
    consumers: ConsumersConfig = ConsumersConfig()
    state_dir: Path | None = Field(
        None, description="where relay state (MaxSCN) is kept; default: beside the buffer file"
    )
    retry_initial: float = Field(0.2, gt=0, description="first backoff after a source error, s")
    retry_max: float = Field(10.0, gt=0, description="longest backoff after source errors, s")
    cluster: ClusterConfig | None = Field(
        None, description="join a relay cluster (docs/cluster.md): one member leads and"
        " captures (with leaders > 1, co-leaders capture beside it), the others chain"
        " from it and take over when it goes")

    @model_validator(mode="after")
    def _leaders(self) -> RelayConfig:
        c = self.cluster
        mode = getattr(self.source, "snapshot_mode", None)  # a chain relay has none
        if c is not None and c.leaders > 1 and mode not in (None, "initial", "no_data"):
            # a co-leader starts no snapshot of its own (snapshot rows depend on when
            # they are read), so the primary's snapshots must all come at its first start
            raise ValueError(
                f"cluster.leaders {c.leaders} needs source.snapshot_mode initial or no_data"
                f" (not {mode}): only the first leader may snapshot")
        return self


def parse_config(raw: Any) -> RelayConfig:
    """Validate a mapping; raises :class:`ConfigError` naming each bad field."""
    return validate(RelayConfig, raw, "relay")


def load_config(path: Path) -> RelayConfig:
    """Read and validate a YAML/JSON config file."""
    return load_file(path, parse_config)
