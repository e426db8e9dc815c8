"""Options of the ``databus`` Spark source, parsed from Spark's string options.

Spark hands a data source its options as a case-insensitive map of strings;
:func:`parse_options` validates them into :class:`StreamOptions` and raises
:class:`~databus.core.errors.ConfigError` naming the bad option, so a query
with a bad option fails at ``load()`` with a clear message.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from databus.client.credentials import Credentials
from databus.client.relay import RelayConnection
from databus.core.access import RelayAccess
from databus.core.config import validate
from databus.core.errors import ConfigError

MAX_PARTITIONS = 1024
MAX_COLUMNAR_ROWS = 1 << 20

class StreamOptions(BaseModel):
    """Validated options (names as given to ``.option(name, value)``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    relay: str = Field(min_length=1, description="Relay base URL, e.g. http://127.0.0.1:11115.")
    sources: tuple[str, ...] = Field(
        min_length=1,
        description="Comma-separated source names (db.table or table) or ids. Typed "
        "before/after structs need exactly one source; use valueFormat=json for several.")
    partitions: int = Field(
        1, ge=1, le=MAX_PARTITIONS,
        description="Spark input partitions; partition i pulls MOD bucket i of this many.")
    max_rows_per_batch: int | None = Field(
        None, alias="maxRowsPerBatch", ge=1,
        description="Admission control: at most this many changes per micro-batch "
        "(whole windows; a single larger window still goes alone).")
    max_bytes_per_batch: int | None = Field(
        None, alias="maxBytesPerBatch", ge=1,
        description="Admission control: at most this many event bytes per micro-batch.")
    starting_position: str = Field(
        "earliest", alias="startingPosition",
        description="earliest (oldest window the relay holds), latest, or an SCN: start "
        "after that window.")
    value_format: Literal["struct", "json"] = Field(
        "struct", alias="valueFormat",
        description="struct: before/after typed from the Avro schema; json: JSON strings.")
    envelope: Literal["full", "flat"] = Field(
        "full",
        description="full: the change envelope (op, scn, sequence, ts_ms, source, key, before, "
        "after); flat: what changes() makes of it (the row's columns, the after image or for "
        "a delete the before image, then _op and _sequence), built without the parts "
        "apply_changes does not read. Needs valueFormat=struct.")
    fetch_bytes: int = Field(
        8 * 1024 * 1024, alias="fetchBytes", ge=4096,
        description="Byte budget of one /stream request made by a partition.")
    rows_per_arrow_batch: int = Field(
        8192, alias="rowsPerArrowBatch", ge=1,
        description="Rows per Arrow record batch yielded by read().")
    prefetch_batches: int = Field(
        8, alias="prefetchBatches", ge=0,
        description="Arrow batches a partition's read fetches and decodes ahead, in a thread, "
        "while Spark sends the previous ones to the JVM (0: no thread). The JVM reader: "
        "above 0, a thread per partition fetches the next /stream page while the task "
        "decodes the current one (at most two pages, 2 x fetchBytes, per partition).")
    columnar_batch_rows: int = Field(
        0, alias="columnarBatchRows", ge=0, le=MAX_COLUMNAR_ROWS,
        description="The JVM reader: rows per columnar batch (Spark column vectors) a "
        "partition's read hands to Spark, e.g. 4096; 0 (the default): one row at a time. Accepted and unused by the "
        "Python source (its batches are Arrow: rowsPerArrowBatch).")
    newest_per_key: bool = Field(
        False, alias="newestPerKey",
        description="The JVM reader: each partition's read gives one row per key, the key's "
        "newest change in the micro-batch (and every truncate), in the order of those changes, "
        "instead of every change: what apply_changes SCD1 keeps anyway, read and shuffled "
        "once per key. The pages holding those changes are held until the partition's read "
        "ends; columnarBatchRows is not used. Refused by the Python source.")
    http_timeout: float = Field(10.0, alias="httpTimeout", gt=0,
                                description="Seconds before a relay request is abandoned.")
    relay_retry_seconds: float = Field(
        30.0, alias="relayRetrySeconds", ge=0,
        description="How long load(), a read or the driver's offset query retries an "
        "unreachable relay (restarting) before failing; 0: fail at once.")
    token_file: str | None = Field(
        None, alias="tokenFile",
        description="File holding the relay's bearer token (read by the driver and every"
        " executor); default: DATABUS_TOKEN / DATABUS_TOKEN_FILE in their environment.")
    ca_file: str | None = Field(
        None, alias="caFile", description="PEM CA(s) the relay's TLS certificate must chain"
        " to; default: DATABUS_CA_FILE, else the system's.")
    cert_file: str | None = Field(
        None, alias="certFile", description="PEM client certificate (chain) for a relay that"
        " requires mutual TLS, with keyFile; default: DATABUS_CERT_FILE.")
    key_file: str | None = Field(
        None, alias="keyFile", description="PEM private key (unencrypted) of certFile;"
        " default: DATABUS_KEY_FILE.")

    consumer_name: str | None = Field(
        None, alias="consumerName", min_length=1, max_length=200, pattern=r"^[\x20-\x7e]+$",
        description="The name this query's reads give the relay (X-Databus-Consumer: GET"
        " /consumers, docs/operations.md); default spark@<host> (spark-jvm@<host> for the"
        " JVM reader).")

    def access(self) -> RelayAccess:
        """The relay settings these options give, as every client describes a relay
        (:class:`databus.core.access.RelayAccess`: the same names, in camelCase here)."""
        return validate(RelayAccess, {"url": self.relay, "token_file": self.token_file,
                                      "ca_file": self.ca_file, "cert_file": self.cert_file,
                                      "key_file": self.key_file}, "relay")

    def connection(self) -> RelayConnection:
        """A connection to the relay with these options' token and TLS settings (TLS
        contexts are shared per process for the same files:
        :meth:`databus.client.credentials.Credentials.ssl_context`)."""
        access = self.access()
        return RelayConnection(access.url, http_timeout=self.http_timeout,
                               credentials=Credentials.from_env(**access.credential_fields()),
                               consumer=self.consumer_name or f"spark@{socket.gethostname()}")

    @property
    def source_scn(self) -> int | None:
        """The SCN of ``startingPosition`` when it is a number."""
        return int(self.starting_position) if self.starting_position.lstrip("-").isdigit() else None


_ALIASES = {name.lower(): name for name in (  # every field's alias (a test checks)
    "relay", "sources", "partitions", "maxRowsPerBatch", "maxBytesPerBatch",
    "startingPosition", "valueFormat", "envelope", "fetchBytes", "rowsPerArrowBatch",
    "prefetchBatches", "httpTimeout", "relayRetrySeconds", "tokenFile", "caFile", "certFile",
    "keyFile", "consumerName", "columnarBatchRows", "newestPerKey")}
# "path" is what .load(url) passes; "url" reads naturally too
_ALIASES["path"] = "relay"
_ALIASES["url"] = "relay"


def parse_options(raw: Mapping[str, str]) -> StreamOptions:
    """Validate Spark options; raises :class:`ConfigError` naming the option."""
    values: dict[str, object] = {}
    for key, value in raw.items():
        name = _ALIASES.get(key.lower())
        if name is None:
            raise ConfigError(
                f"databus source: unknown option {key!r}; known: {sorted(set(_ALIASES.values()))}")
        values[name] = value
    if "sources" in values:
        values["sources"] = tuple(s.strip() for s in str(values["sources"]).split(",") if s.strip())
    try:
        opts = StreamOptions.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"databus source: invalid options: {problems}") from exc
    if opts.envelope == "flat" and opts.value_format != "struct":
        raise ConfigError("databus source: envelope=flat needs valueFormat=struct")
    pos = opts.starting_position
    if pos not in ("earliest", "latest") and opts.source_scn is None:
        raise ConfigError(
            f"databus source: startingPosition must be earliest, latest or an SCN, got {pos!r}")
    return opts
