"""The configuration of a source: one validated model per kind of source.

The URL's scheme picks the model (a tagged union, :data:`SourceConfig`):
``sqlite://`` :class:`SqliteSourceConfig`, ``mysql://``/``mariadb://``
:class:`MysqlSourceConfig`, ``postgresql://``/``postgres://``
:class:`PostgresSourceConfig`, ``databus+http(s)://``/``databus+zk://``
:class:`ChainSourceConfig`. Each model holds only the settings its source applies, so
a setting of another kind of source (``server_id`` on SQLite, ``slot`` on MySQL) is a
one-line error naming the kinds it belongs to, never accepted and ignored.

Sources are built from it (``databus.sources.open_source``); the relay's config
(``databus.relay.config``) holds it as its ``source`` section; :func:`parse_source`
validates a mapping on its own.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlparse

from pydantic import (
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from databus.core.access import RelayAccess
from databus.core.config import FrozenModel, RegexList, config_error
from databus.core.errors import ConfigError
from databus.core.redact import redact_url, url_password

log = logging.getLogger("databus.config")

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
    algorithm: Literal["sha256", "sha512"] = Field("sha256", description="sha256 or sha512")


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


def legacy_tls(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``tls: {ca_file, cert_file, key_file}``, the spelling of relay credentials before
    :class:`~databus.core.access.RelayCredentials`, moved to the flat fields (logged
    once per config read); ``verify: false`` is refused: a relay's certificate is always
    verified."""
    tls = raw.get("tls")
    if not isinstance(tls, dict):
        return raw
    tls = dict(tls)
    if tls.pop("verify", True) is not True:
        raise ValueError("tls.verify: a relay's certificate is always verified (give"
                         " ca_file for a private CA)")
    clash = sorted(k for k in tls if k in raw)
    if clash:
        raise ValueError(f"tls.{clash[0]} and {clash[0]} both given: give {clash[0]} only")
    log.warning("%s.tls.%s: the old spelling of %s.%s (relay credentials are"
                " token_file, ca_file, cert_file, key_file everywhere); please rename it",
                where, "/".join(sorted(tls)), where, "/".join(sorted(tls)))
    out = {k: v for k, v in raw.items() if k != "tls"}
    out.update(tls)
    return out


class _Source(FrozenModel):
    """What every source takes: where, which tables, and column protection."""

    kind: ClassVar[str]
    """The ``kind`` of source (``sqlite``, ``mysql``, ``postgresql``, ``chain``)."""

    url: str = Field(description="sqlite:///PATH.db, mysql://USER[:PASS]@HOST:PORT,"
                     " postgresql://USER[:PASS]@HOST:PORT/DB, or a chain relay's upstream:"
                     " databus+http(s)://HOST:PORT or databus+zk://HOST:PORT/NAME")
    tables: list[str] = Field(
        default_factory=list,
        description="tables to capture (names for SQLite; regexes 'db\\.table' for MySQL,"
                    " 'schema\\.table' for PostgreSQL and a chain relay's upstream tables)",
    )
    columns: list[ColumnRule] = Field(
        default_factory=list, description="columns masked, truncated or hashed before they"
        " are stored (docs/security.md)")

    @classmethod
    def _legacy(cls, raw: dict[str, Any]) -> dict[str, Any]:
        """Older spellings of this kind's settings, rewritten (a kind may override)."""
        return raw

    @model_validator(mode="before")
    @classmethod
    def _foreign(cls, raw: Any) -> Any:
        """A setting of another kind of source is named as such (not "extra input")."""
        if isinstance(raw, dict):
            raw = cls._legacy(raw)
            for key in raw:
                if key in cls.model_fields:
                    continue
                owners = [k for k, m in _MODELS.items() if key in m.model_fields]
                if owners:
                    raise ValueError(
                        f"{key} is a setting of {' and '.join(_KIND_NAMES[o] for o in owners)}"
                        f" sources only, not of a {_KIND_NAMES[cls.kind]} source")
        return raw

    @field_validator("url")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if "://" not in v:
            raise ValueError("source url needs a scheme, e.g. sqlite:///path.db")
        return v

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, (redact_url(value) if name == "url" else value)


class _DatabaseSource(_Source):
    """What the database sources (SQLite, MySQL, PostgreSQL) share."""

    include_columns: RegexList = Field(
        default_factory=list,
        description="regexes on 'db.table.column' ('schema.table.column' for PostgreSQL,"
        " 'table.column' for SQLite) to keep (empty = all); key columns are always kept")
    exclude_columns: RegexList = Field(
        default_factory=list, description="regexes on the same names to leave out: absent"
        " from events, snapshots and stores (SQLite: dropped as its txlog is read, so the"
        " values stay in that database until the txlog is trimmed); key columns are always"
        " kept")
    snapshot_mode: SnapshotMode = Field(
        "initial",
        description="initial (existing rows as a snapshot, then stream; the default),"
                    " initial_only, no_data (stream only), when_needed (snapshot when the"
                    " position is gone), always (snapshot at every start)")
    snapshot_chunk_size: int = Field(1024, ge=1, le=1_000_000, description="rows per"
                                     " snapshot chunk")



class ServerSourceConfig(_DatabaseSource):
    """What the database servers (MySQL, PostgreSQL) share."""

    password_file: Path | None = Field(
        None, description="file whose first line is the source password (instead of one in"
        " the URL)")
    exclude_tables: RegexList = Field(
        default_factory=list, description="regexes on the table names left out after"
        " tables")
    signal_table: str = Field(
        "databus.signals", pattern=r"^[^.\s]+\.[^.\s]+$",
        description="db.table (schema.table) of signals and snapshot watermarks (created when"
                    " a snapshot mode needs it)")
    progress_interval: float = Field(
        10.0, ge=0, le=3600,
        description="when the captured tables are quiet but the log moves (other tables,"
                    " heartbeats, rotations), an empty window carries the position at most"
                    " this often (seconds; 0 = never), so consumers' checkpoints and the"
                    " relay's restart position move and the server may drop old log")
    network_timeout: float = Field(
        30.0, ge=3, le=3600,
        description="seconds a connection to the server may go without an answer (to"
                    " connect, to a statement, to data sent, to TCP keepalives while idle)"
                    " before the server counts as lost and capture retries: a network that"
                    " drops packets silently is noticed within it (MySQL's binlog stream"
                    " sooner: five missed 1 s heartbeats)")


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


class SqliteSourceConfig(_DatabaseSource):
    """A SQLite database captured through triggers and a txlog (docs/sqlite.md)."""

    kind: ClassVar[str] = "sqlite"
    poll_interval: float = Field(0.05, gt=0, le=60, description="seconds between idle polls")
    window_cuts: Literal["local", "shared"] = Field(
        "local",
        description="where window boundaries come from. local (the default): each"
                    " poll's snapshot is one window, so relays reading the same database at"
                    " different moments cut it differently; shared: boundaries are rows of"
                    " _databus_cuts in the database, so every relay capturing it emits the"
                    " same windows (a relay cluster with leaders > 1 turns it on); costs one"
                    " short write transaction per poll that finds new data")


class MysqlSourceConfig(ServerSourceConfig):
    """A MariaDB/MySQL server read as a replica (docs/mysql.md)."""

    kind: ClassVar[str] = "mysql"
    tls: SourceTlsConfig | None = Field(None, description="TLS to the source database")
    server_id: int | None = Field(
        None, ge=1, le=2**32 - 1,
        description="the replica server id this relay uses, unique among the server's"
                    " replicas; default: derived from the relay's name, in"
                    " 3000000000..3999999999")
    start_gtid: str | None = Field(
        None, pattern=r"^(\d+-\d+-\d+(,\d+-\d+-\d+)*|[0-9a-fA-F-]{36}(:\d+(-\d+)?)+"
                      r"(,[0-9a-fA-F-]{36}(:\d+(-\d+)?)+)*)$",
        description="a new relay starts right after this GTID state instead of at the"
                    " binlog's end: MariaDB '0-1-1234', MySQL 'uuid:1-1234'")


class PostgresSourceConfig(ServerSourceConfig):
    """A PostgreSQL database read through logical decoding (docs/postgresql.md)."""

    kind: ClassVar[str] = "postgresql"
    slot: str | None = Field(
        None, pattern=r"^[a-z0-9_]{1,63}$",
        description="the logical replication slot this relay owns (created on a fresh"
                    " start; default databus_<relay name>, in a cluster without a name"
                    " databus_<cluster name>)")
    publication: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$",
        description="the publication whose changes are read (default as the slot's); it"
                    " must cover every captured table")
    create_publication: bool = Field(
        False, description="create the publication (or add the missing tables to it) at"
                           " start instead of refusing with the statement to run; needs the"
                           " right to do so")


class ChainSourceConfig(_Source, RelayAccess):
    """Another relay, read like any client (a chain relay, docs/cluster.md): ``url`` is
    ``databus+http(s)://HOST:PORT`` or ``databus+zk://HOST:PORT/NAME``, and the
    credentials are :class:`databus.core.access.RelayCredentials`' fields."""

    kind: ClassVar[str] = "chain"
    network_timeout: float = Field(
        30.0, ge=1, le=3600,
        description="seconds a request to the upstream relay may go without an answer"
                    " beyond its long poll (and to connect) before the upstream counts as"
                    " lost and capture retries (the next member of a list or cluster): a"
                    " network that drops packets silently is noticed within it")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return v  # a chain source is a mapping with its url (no string shorthand)

    @classmethod
    def _legacy(cls, raw: dict[str, Any]) -> dict[str, Any]:
        return legacy_tls(raw, "source")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        scheme, _, rest = v.partition("://")
        if scheme not in ("databus+http", "databus+https", "databus+zk") or not rest:
            raise ValueError("a chain relay's source url is databus+http://HOST:PORT,"
                             " databus+https://HOST:PORT or databus+zk://HOST:PORT/NAME")
        from databus.core.access import check_relay_spec

        check_relay_spec(v[len("databus+"):])
        return v


_MODELS: dict[str, type[_Source]] = {
    m.kind: m for m in (SqliteSourceConfig, MysqlSourceConfig, PostgresSourceConfig,
                        ChainSourceConfig)}
_KIND_NAMES = {"sqlite": "SQLite", "mysql": "MySQL/MariaDB", "postgresql": "PostgreSQL",
               "chain": "chain relay"}
_SCHEMES = {"sqlite": "sqlite", "mysql": "mysql", "mariadb": "mysql",
            "postgresql": "postgresql", "postgres": "postgresql", "databus+http": "chain",
            "databus+https": "chain", "databus+zk": "chain"}


def source_kind(url: str) -> str | None:
    """The kind of source a URL names (``sqlite``, ``mysql``, ``postgresql``, ``chain``),
    None for an unknown scheme."""
    return _SCHEMES.get(urlparse(url).scheme) if "://" in url else None


def _discriminate(raw: Any) -> str | None:
    url = raw.get("url") if isinstance(raw, dict) else getattr(raw, "url", None)
    kind = source_kind(url) if isinstance(url, str) else None
    return f"<{kind}>" if kind else None


SourceConfig = Annotated[
    Annotated[SqliteSourceConfig, Tag("<sqlite>")]
    | Annotated[MysqlSourceConfig, Tag("<mysql>")]
    | Annotated[PostgresSourceConfig, Tag("<postgresql>")]
    | Annotated[ChainSourceConfig, Tag("<chain>")],
    Discriminator(
        _discriminate, custom_error_type="source_url",
        custom_error_message="source url must start with sqlite://, mysql://, mariadb://,"
        " postgresql://, postgres://, databus+http://, databus+https:// or databus+zk://"),
]
"""Any source's config: the model of the kind its ``url`` names (module docstring)."""

AnySourceConfig = SqliteSourceConfig | MysqlSourceConfig | PostgresSourceConfig | ChainSourceConfig
"""The same union as a plain type, for annotations and isinstance checks."""

_ADAPTER: TypeAdapter[AnySourceConfig] = TypeAdapter(SourceConfig)


def parse_source(raw: Any) -> AnySourceConfig:
    """Validate a ``source`` mapping into its kind's model; a ConfigError naming each bad
    field otherwise."""
    if not isinstance(raw, dict):
        raise ConfigError("source config must be a mapping")
    try:
        return _ADAPTER.validate_python(raw)
    except ValidationError as exc:
        raise config_error(exc, "source") from exc
