"""Client configuration (:class:`ClientConfig`), a validated pydantic model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from databus.client.credentials import Credentials
from databus.core.access import CLIENT_LEGACY_NAMES, RelayAccess, fold_relay_fields
from databus.core.config import ConfigModel, FrozenModel
from databus.core.filters import ServerFilter


class ClientConfig(ConfigModel):
    """Everything a :class:`~databus.client.DatabusClient` needs.

    Only ``relay`` is required: the relay's URL (a string), or its whole
    :class:`~databus.core.access.RelayAccess` (URL, token, TLS files). Retry settings:

    * consumer failures (a callback returned ERROR or raised, a checkpoint
      could not be saved): the window is rolled back and replayed at most
      ``max_retries`` times in a row, waiting ``backoff_initial`` doubling up to
      ``backoff_max`` (with jitter) in between; then ``RetriesExhaustedError``.
    * relay unavailable (connection refused, timeouts, 5xx): retried with the
      same backoff, ``relay_max_retries`` times in a row or forever when None.
    """

    relay: RelayAccess = Field(
        description="the relay: its base URL (http://127.0.0.1:11115), a comma-separated list"
        " of relays, or a relay cluster's address zk://HOST:PORT/NAME (on failure the client"
        " moves to another member with its checkpoint), with the token and TLS files to"
        " present (databus.core.access)")
    sources: list[str | int] = Field(
        default_factory=list,
        description="sources to consume, by name ('db.table') or id; empty = all of the relay's",
    )
    filter: str | None = Field(
        None, description="server-side filter, Databus JSON (see databus.core.filters)"
    )
    partitions: str | None = Field(
        None, pattern=r"^MOD:[1-9][0-9]{0,4}$",
        description="static client cluster: 'MOD:N' splits every source's keys into N"
        " buckets (server-side MOD filter); this member reads bucket ``member``. Needs"
        " ``sources`` named (a table added later would reach every member)")
    member: int | None = Field(None, ge=0, description="with ``partitions``: this member's"
                               " bucket, 0 to N-1")
    fetch_size: int = Field(4 * 1024 * 1024, ge=1024, description="bytes per /stream response")
    poll_timeout: float = Field(10.0, ge=0, le=600, description="long-poll seconds per request")
    linger: float = Field(
        0.003, ge=0, le=1, description="seconds the next /stream request waits after an"
        " answer of ``linger_after_windows`` or more windows that ``fetch_size`` did not cut:"
        " windows then arrive faster than requests go round, and the wait gathers more of"
        " them per answer (an answer costs more CPU than a one-row window). 0 = never wait")
    linger_after_windows: int = Field(
        8, ge=1, description="windows in one answer from which ``linger`` applies; an"
        " answer of fewer windows (an idle or slow source) is followed at once")
    http_timeout: float = Field(
        30.0, gt=0, description="connect timeout and read margin on top of poll_timeout"
    )
    max_retries: int = Field(5, ge=0, description="replays of one failing window")
    backoff_initial: float = Field(0.1, gt=0, description="first retry delay, seconds")
    backoff_max: float = Field(10.0, gt=0, description="largest retry delay, seconds")
    relay_max_retries: int | None = Field(
        None, ge=0, description="consecutive relay failures tolerated; None = forever"
    )
    checkpoint_every_windows: int = Field(
        1, ge=1, description="persist the checkpoint every N windows (always at a window end)"
    )
    checkpoint_path: Path | None = Field(
        None, description="file checkpoint store used when no store is given"
    )
    from_start: bool = Field(
        True,
        description="with no stored checkpoint: True = oldest window the relay holds "
        "(flexible checkpoint), False = only windows committed from now on",
    )
    verify_crc: bool = Field(True, description="check both CRCs of every received event")
    fall_off_warning: float = Field(
        60.0, ge=0, le=86_400, description="warn (a log line a minute) while this consumer"
        " is fewer than this many seconds of source time ahead of the relay's oldest window:"
        " a pause that long makes it fall off the buffer (databus.client.falloff). 0 = never")
    consumer_name: str | None = Field(
        None, min_length=1, max_length=200, pattern=r"^[\x20-\x7e]+$",
        description="this consumer's name, sent with every request (X-Databus-Consumer) and"
        " the label of its metrics: the relay lists it at GET /consumers; default: the"
        " checkpoint store's (a file's name, a sink's row) @ host, else host-pid")
    bootstrap_url: str | None = Field(
        None, description="bootstrap server used when the relay no longer holds the checkpoint "
        "(ScnNotFound); None = that is a terminal error")
    bootstrap_new_consumers: bool = Field(
        True, description="with a bootstrap_url and no stored checkpoint: start with a "
        "bootstrap (snapshot + catch-up) instead of the relay's oldest window")
    bootstrap_batch_size: int = Field(
        10_000, ge=1, le=1_000_000, description="snapshot rows / catch-up events per request")
    bootstrap_progress_interval: float = Field(
        10.0, gt=0, description="seconds between bootstrap progress log lines (rows, rate, ETA)")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, raw: Any) -> Any:
        return fold_relay_fields(raw, CLIENT_LEGACY_NAMES, "ClientConfig")

    def credentials(self) -> Credentials:
        """The token and TLS files to present to the relay and the bootstrap server
        (``relay``'s fields, then the environment)."""
        return Credentials.from_env(**self.relay.credential_fields())

    @field_validator("bootstrap_url")
    @classmethod
    def _bootstrap_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("bootstrap_url must be an http:// or https:// URL")
        return v.rstrip("/") if v is not None else None

    @field_validator("filter", mode="before")
    @classmethod
    def _filter(cls, v: Any) -> Any:
        if isinstance(v, ServerFilter):
            return v.to_json()
        if isinstance(v, dict):
            v = json.dumps(v)
        if isinstance(v, str):
            ServerFilter.parse(v)  # raises InvalidFilterError with a clear message
        return v

    @model_validator(mode="after")
    def _backoff(self) -> ClientConfig:
        if self.backoff_max < self.backoff_initial:
            raise ValueError("backoff_max must be >= backoff_initial")
        if (self.partitions is None) != (self.member is None):
            raise ValueError("partitions and member go together")
        if self.partitions is not None and self.member is not None:
            n = int(self.partitions.split(":")[1])
            if self.member >= n:
                raise ValueError(f"member must be below the {n} partitions, got {self.member}")
            if self.filter is not None:
                raise ValueError("give either filter or partitions (a partition is a filter)")
            if not self.sources:
                raise ValueError("partitions need sources named: a table added later would"
                                 " otherwise reach every member")
        return self

    def filter_for(self, src_ids: list[int]) -> str | None:
        """The server-side filter to send: ``filter``, or this member's MOD bucket of
        every source in ``src_ids``."""
        if self.partitions is None or self.member is None:
            return self.filter
        n = int(self.partitions.split(":")[1])
        return ServerFilter.mod(src_ids, n, self.member, self.member + 1).to_json()


class BatchConfig(FrozenModel):
    """How the replicate sink gathers whole windows into one target transaction
    (:mod:`databus.client.sinks.replicate`): a batch is committed when it holds ``rows``
    row changes or ``bytes`` bytes of rows, or when it is ``linger`` seconds old, and
    while one batch is written the next one is gathered."""

    rows: int = Field(
        10_000, ge=1, le=1_000_000, description="row changes per target transaction at"
        " most (a window is never split: one larger than this is a transaction of its"
        " own); 1 = a transaction per window")
    bytes: int = Field(
        16 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024,
        description="bytes of row images per target transaction at most (what the"
        " batches in memory cost: up to three of them at once)")
    linger: float = Field(
        0.1, ge=0, le=60, description="seconds a batch waits for more windows before it"
        " is committed: the latency batching adds while the source is slow; under load"
        " batches are committed as fast as the target takes them")


NEVER = 1 << 62
"""``checkpoint_every_windows`` of a client whose consumer says when to checkpoint."""


class ReplicateConfig(ClientConfig):
    """``databus replicate``'s settings: the client's, and how the sink batches windows
    (``batch``). :meth:`client_config` is what its :class:`DatabusClient` gets."""

    batch: BatchConfig = Field(default_factory=BatchConfig,
                               description="windows per target transaction")

    @model_validator(mode="after")
    def _sink_keeps_the_position(self) -> ReplicateConfig:
        given = {"checkpoint_every_windows", "checkpoint_path"} & self.model_fields_set
        if given:
            raise ValueError(
                f"{', '.join(sorted(given))}: replicate keeps its position in the target,"
                " committed with each batch of windows; size batches with batch.rows,"
                " batch.bytes and batch.linger")
        return self

    def client_config(self) -> ClientConfig:
        """The client's settings: the sink decides when a checkpoint is saved (each save
        commits its open batch), so the client saves only when asked, when idle and
        when it stops, not every ``checkpoint_every_windows`` windows."""
        raw = self.model_dump(exclude={"batch"})
        raw["checkpoint_every_windows"] = NEVER
        return ClientConfig.model_validate(raw)
