"""The configuration of a source: one validated model, one docstring per field.

Sources are built from it (``databus.sources.open_source``); the relay's config
(``databus.relay.config``) holds it as its ``source`` section. ``snapshot_mode`` is
validated here once, as a literal type, for every source.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from databus.core.config import FrozenModel
from databus.core.errors import ConfigError
from databus.core.redact import redact_url, url_password

SnapshotMode = Literal["initial", "initial_only", "no_data", "when_needed", "always"]
"""What a source snapshots (docs/snapshots.md)."""

SNAPSHOT_MODES: tuple[SnapshotMode, ...] = (
    "initial", "initial_only", "no_data", "when_needed", "always")


class SourceTlsConfig(FrozenModel):
    """TLS to the source database (MySQL/MariaDB). The server's certificate is verified
    (against ``ca_file``, else the system's CAs, and its host name) unless ``verify``
    is false."""

    ca_file: Path | None = Field(None, description="PEM CA(s) the server certificate must"
                                 " chain to (MariaDB's ssl-ca)")
    cert_file: Path | None = Field(None, description="client certificate (ssl-cert)")
    key_file: Path | None = Field(None, description="its private key (ssl-key)")
    verify: bool = Field(True, description="verify the server's certificate and host name")


class HashAction(FrozenModel):
    """Hash a column: hex digest of ``salt`` + value (UTF-8)."""

    salt: str = Field(min_length=1, description="prepended to every value before hashing")
    algorithm: Literal["sha256", "sha512"] = "sha256"


class ColumnRule(FrozenModel):
    """Protect one column of the tables a regex names (:mod:`databus.sources.protect`):
    exactly one of ``mask``, ``truncate``, ``hash``."""

    table: str = Field(description="regex on 'db.table' (full match)")
    column: str = Field(min_length=1, description="the column's name")
    mask: str | None = Field(None, description="replace every value by this string")
    truncate: int | None = Field(None, ge=0, description="keep the first N characters")
    hash: HashAction | None = Field(None, description="salted SHA-256/512, lowercase hex")

    @model_validator(mode="after")
    def _one_action(self) -> ColumnRule:
        given = [a for a in ("mask", "truncate", "hash") if getattr(self, a) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of mask, truncate, hash")
        try:
            re.compile(self.table)
        except re.error as exc:
            raise ValueError(f"bad table regex {self.table!r}: {exc}") from exc
        return self


class SourceConfig(FrozenModel):
    """Where changes come from."""

    url: str = Field(description="sqlite:///PATH.db, mysql://USER[:PASS]@HOST:PORT,"
                     " postgresql://USER[:PASS]@HOST:PORT/DB, or a chain relay's upstream:"
                     " databus+http(s)://HOST:PORT")
    password_file: Path | None = Field(
        None, description="file whose first line is the source password (instead of one in"
        " the URL)")
    tls: SourceTlsConfig | None = Field(
        None, description="TLS to the source database (a chain relay: to its upstream relay)")
    token_file: Path | None = Field(
        None, description="chain relay: file holding the token for the upstream relay"
        " (default: DATABUS_TOKEN / DATABUS_TOKEN_FILE)")
    tables: list[str] = Field(
        default_factory=list,
        description="tables to capture (names for SQLite; regexes 'db\\.table' for MySQL,"
                    " 'schema\\.table' for PostgreSQL)",
    )
    poll_interval: float = Field(0.05, gt=0, le=60, description="seconds between idle polls")
    exclude_tables: list[str] = Field(
        default_factory=list, description="MySQL: regexes on 'db.table' left out after --tables")
    include_columns: list[str] = Field(
        default_factory=list,
        description="MySQL: regexes on 'db.table.column' to keep (empty = all); keys always kept")
    exclude_columns: list[str] = Field(
        default_factory=list, description="MySQL: regexes on 'db.table.column' to leave out")
    server_id: int | None = Field(
        None, ge=1, le=2**32 - 1,
        description="MySQL: the replica server id this relay uses (unique per server);"
                    " default: derived from the relay's name, in 3000000000..3999999999")

    start_gtid: str | None = Field(
        None, pattern=r"^(\d+-\d+-\d+(,\d+-\d+-\d+)*|[0-9a-fA-F-]{36}(:\d+(-\d+)?)+"
                      r"(,[0-9a-fA-F-]{36}(:\d+(-\d+)?)+)*)$",
        description="MySQL: a new relay starts right after this GTID state instead of at the"
                    " binlog's end: MariaDB '0-1-1234', MySQL 'uuid:1-1234'")
    slot: str | None = Field(
        None, pattern=r"^[a-z0-9_]{1,63}$",
        description="PostgreSQL only: the logical replication slot this relay owns (created on"
                    " a fresh start; default databus_<relay name>, in a cluster without a name"
                    " databus_<cluster name>)")
    publication: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$",
        description="PostgreSQL only: the publication whose changes are read (default"
                    " as the slot's); it must cover every captured table")
    create_publication: bool = Field(
        False, description="PostgreSQL only: create the publication (or add the missing"
                           " tables to it) at start instead of refusing with the statement to"
                           " run; needs the right to do so")
    snapshot_mode: SnapshotMode = Field(
        "initial",
        description="initial (existing rows as a snapshot, then stream; the default),"
                    " initial_only, no_data (stream only), when_needed (snapshot when the"
                    " position is gone), always (snapshot at every start)")
    signal_table: str = Field(
        "databus.signals", pattern=r"^[^.\s]+\.[^.\s]+$",
        description="MySQL: db.table of signals and snapshot watermarks (created when a"
                    " snapshot mode needs it)")
    progress_interval: float = Field(
        10.0, ge=0, le=3600,
        description="MySQL: when the captured tables are quiet but the binlog moves (other"
                    " schemas, heartbeats, rotations), an empty window carries the position at"
                    " most this often (seconds; 0 = never), so consumers' checkpoints and the"
                    " relay's restart position move and a purge never takes them")
    snapshot_chunk_size: int = Field(1024, ge=1, le=1_000_000,
                                     description="rows per snapshot chunk (SQLite and MySQL)")
    window_cuts: Literal["local", "shared"] = Field(
        "local",
        description="SQLite: where window boundaries come from. local (the default): each"
                    " poll's snapshot is one window, so relays reading the same database at"
                    " different moments cut it differently; shared: boundaries are rows of"
                    " _databus_cuts in the database, so every relay capturing it emits the"
                    " same windows (a relay cluster with leaders > 1 turns it on); costs one"
                    " short write transaction per poll that finds new data. MySQL ignores"
                    " it: its windows are binlog transactions already")
    columns: list[ColumnRule] = Field(
        default_factory=list, description="columns masked, truncated or hashed before they"
        " are stored (docs/security.md)")

    @field_validator("exclude_tables", "include_columns", "exclude_columns")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        for p in v:
            try:
                re.compile(p)
            except re.error as exc:
                raise ValueError(f"bad regex {p!r}: {exc}") from exc
        return v

    @field_validator("url")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if "://" not in v:
            raise ValueError("source url needs a scheme, e.g. sqlite:///path.db")
        return v

    def password(self) -> str | None:
        """The source password: ``password_file``'s first line, else the URL's."""
        if self.password_file is None:
            return url_password(self.url)
        try:
            lines = self.password_file.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"cannot read password file {self.password_file}:"
                              f" {exc.strerror or exc}") from exc
        return lines[0] if lines else ""

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, (redact_url(value) if name == "url" else value)
