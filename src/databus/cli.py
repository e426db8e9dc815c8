"""The ``databus`` command line.

Every command turns a :class:`~databus.core.errors.DatabusError` into a one-line
message on stderr and exit status 2 (terminal) or 3 (transient), never a
traceback. Commands parse options and call the part they run (the relay, the
runners of :mod:`databus.client.runners`, the bootstrap service); each imports
its part only when it runs, so a command does not load the others' dependencies
(the relay's sources and their drivers, SQLAlchemy, uvicorn).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, Protocol

import typer

from databus.core.errors import DatabusError
from databus.core.redact import RedactingFilter, Redactor, redact_url, url_password


class HttpServiceLike(Protocol):
    def request_exit(self, *_: Any) -> None: ...

    def run(self) -> None: ...

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Databus for Python: change data capture relays, consumers and sinks.",
)


def _setup_logging(verbose: bool, redactor: Redactor | None = None) -> Redactor:
    """Logging to stderr through the redaction filter; returns the redactor, to which a
    command adds its secrets as soon as it knows them."""
    redactor = redactor if redactor is not None else Redactor()
    # logs go to stderr: stdout carries data (tail's JSON lines)
    handler: logging.Handler
    if sys.stderr.isatty():
        from rich.console import Console  # imported when run: --help stays quick
        from rich.logging import RichHandler

        handler = RichHandler(console=Console(stderr=True), show_path=False,
                              rich_tracebacks=False)
    else:
        # a log file or a journal: one plain line per record. Measured reason: Rich
        # renders a table per record (~0.7 ms), which a server logging per connection
        # (the binlog service) paid inside every client's connection set-up
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter(redactor))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(message)s",
                        handlers=[handler], force=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return redactor


def _fail(exc: DatabusError, redactor: Redactor | None = None) -> NoReturn:
    text = f"databus: {exc.code}: {exc}"
    typer.echo(redactor(text) if redactor is not None else Redactor()(text), err=True)
    raise typer.Exit(3 if exc.retryable else 2)


def _with_password(url: str, file: Path | None, env: str) -> str:
    """``url`` with the password from ``file`` (first line) or the environment variable
    ``env``; unchanged when neither is given."""
    from sqlalchemy.engine import make_url  # imported when run (see top)

    from databus.client.credentials import read_secret_file

    password = read_secret_file(file, "password file") if file is not None else os.environ.get(env)
    if not password:
        return url
    return make_url(url).set(password=password).render_as_string(hide_password=False)


def _private_files() -> None:
    """Files and directories a server creates (buffers, state, checkpoints, stores,
    schema history) are its own: 0600 and 0700."""
    os.umask(0o077)


def _serve_until_signal(service: HttpServiceLike, reload: Callable[[], None]) -> None:
    """SIGTERM and SIGINT stop ``service`` cleanly (exit 0); SIGHUP runs ``reload``."""
    signal.signal(signal.SIGTERM, service.request_exit)
    signal.signal(signal.SIGINT, service.request_exit)
    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=reload, daemon=True).start())
    service.run()


def _http_overrides(host: str | None, token_file: Path | None, insecure: bool,
                    tls_cert: Path | None, tls_key: Path | None,
                    tls_client_ca: Path | None) -> dict[str, object]:
    out: dict[str, object] = {}
    if host is not None:
        out["host"] = host
    if token_file is not None:
        out["token_file"] = str(token_file)
    if insecure:
        out["insecure"] = True
    if tls_cert is not None or tls_key is not None:
        if tls_cert is None or tls_key is None:
            raise typer.BadParameter("--tls-cert and --tls-key go together")
        tls: dict[str, str] = {"cert_file": str(tls_cert), "key_file": str(tls_key)}
        if tls_client_ca is not None:
            tls["client_ca_file"] = str(tls_client_ca)
        out["tls"] = tls
    elif tls_client_ca is not None:
        raise typer.BadParameter("--tls-client-ca needs --tls-cert and --tls-key")
    return out


HostOpt = Annotated[str | None, typer.Option(
    help="address to bind (default 127.0.0.1; beyond loopback needs --token-file or"
    " --insecure)")]
TokenFileOpt = Annotated[Path | None, typer.Option(
    help="bearer token file (databus token add); re-read on SIGHUP")]
InsecureOpt = Annotated[bool, typer.Option(
    "--insecure", help="serve beyond loopback without tokens (warned at every start)")]
TlsCertOpt = Annotated[Path | None, typer.Option(help="TLS: PEM certificate (chain)")]
TlsKeyOpt = Annotated[Path | None, typer.Option(help="TLS: PEM private key")]
TlsClientCaOpt = Annotated[Path | None, typer.Option(
    help="mutual TLS: PEM CA client certificates must chain to")]


def _csv(value: str | None) -> list[str]:
    return [p.strip() for p in value.split(",") if p.strip()] if value else []


def _regexes(value: str | None) -> list[str]:
    """Comma-separated regexes; a comma inside braces, brackets or parentheses belongs
    to its regex (``x{1,3}``, ``[a,b]``), and ``\\,`` is a literal comma."""
    out: list[str] = []
    part, depth, escaped = "", 0, False
    for ch in value or "":
        if escaped:
            part, escaped = part + ch, False
            continue
        if ch == "\\":
            part, escaped = part + ch, True
            continue
        if ch in "{[(":
            depth += 1
        elif ch in "}])" and depth:
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(part)
            part = ""
            continue
        part += ch
    out.append(part)
    return [p.strip() for p in out if p.strip()]


def _stop_on_sigterm() -> threading.Event:
    """An event SIGTERM sets. From a helper thread: a signal handler must not wait for
    a lock the thread it interrupted may hold (the event's own)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM,
                  lambda *_: threading.Thread(target=stop.set, daemon=True).start())
    return stop


@app.command()
def relay(
    config: Annotated[Path | None, typer.Option(help="relay YAML config file")] = None,
    source: Annotated[str | None, typer.Option(
        help="source URL: sqlite:///shop.db, mysql://USER@HOST:PORT,"
        " postgresql://USER@HOST:PORT/DB, or databus+http://HOST:PORT")] = None,
    tables: Annotated[str | None, typer.Option(help="comma-separated tables to capture")] = None,
    port: Annotated[int, typer.Option(help="HTTP port")] = 11115,
    buffer_path: Annotated[Path | None, typer.Option(help="persistent buffer file")] = None,
    buffer_size: Annotated[int | None, typer.Option(help="buffer capacity in bytes")] = None,
    snapshot_mode: Annotated[str | None, typer.Option(
        help="initial (default), initial_only, no_data, when_needed or always")] = None,
    password_file: Annotated[Path | None, typer.Option(
        help="file whose first line is the source password (keeps it out of the URL)")] = None,
    slot: Annotated[str | None, typer.Option(
        help="PostgreSQL: the replication slot (default databus_<relay name>)")] = None,
    publication: Annotated[str | None, typer.Option(
        help="PostgreSQL: the publication covering the tables")] = None,
    create_publication: Annotated[bool, typer.Option(
        help="PostgreSQL: create (or extend) the publication if needed")] = False,
    host: HostOpt = None,
    token_file: TokenFileOpt = None,
    insecure: InsecureOpt = False,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    tls_client_ca: TlsClientCaOpt = None,
    cluster: Annotated[str | None, typer.Option(
        help="join a relay cluster: zk://HOST:PORT[,HOST:PORT]/NAME (docs/cluster.md)")] = None,
    member_id: Annotated[str | None, typer.Option(
        help="this relay's name in its cluster (default: host-pid)")] = None,
    advertise_url: Annotated[str | None, typer.Option(
        help="the URL other members and clients reach this relay at")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run a relay: capture a source (a database, or another relay with
    --source databus+http://HOST:PORT) and serve its changes over HTTP."""
    from databus.relay.config import load_config, parse_config  # imported when run (see top)
    from databus.relay.relay import Relay, config_from_args

    redactor = _setup_logging(verbose, Redactor([url_password(source or "")]))
    try:
        _private_files()
        http = _http_overrides(host, token_file, insecure, tls_cert, tls_key, tls_client_ca)
        cluster_opts = {k: v for k, v in (("address", cluster), ("member_id", member_id),
                                          ("advertise_url", advertise_url)) if v is not None}
        if cluster_opts and "address" not in cluster_opts and config is None:
            raise typer.BadParameter("--member-id and --advertise-url go with --cluster")
        pg = {k: v for k, v in (("slot", slot), ("publication", publication),
                                ("create_publication", create_publication or None))
              if v is not None}
        if config is not None:
            if source is not None or tables is not None or snapshot_mode is not None or pg:
                raise typer.BadParameter(
                    "give either --config or --source/--tables/--snapshot-mode"
                    "/--slot/--publication/--create-publication")
            cfg = load_config(config)
            if http or password_file is not None or cluster_opts:  # options win over the file
                raw = cfg.model_dump(mode="json", exclude_unset=True)
                raw["http"] = {**raw.get("http", {}), **http}
                if password_file is not None:
                    raw["source"]["password_file"] = str(password_file)
                if cluster_opts:
                    raw["cluster"] = {**(raw.get("cluster") or {}), **cluster_opts}
                cfg = parse_config(raw)
        else:
            if source is None:
                raise typer.BadParameter("--config or --source is required")
            cfg = config_from_args(source, _regexes(tables), port, buffer_path, buffer_size,
                                   snapshot_mode, http=http, password_file=password_file,
                                   cluster=cluster_opts or None, source=pg or None)
        redactor.add(url_password(cfg.source.url), cfg.source.password())
        r = Relay(cfg)
        cfg_path = config

        def reload() -> None:
            r.reload_tokens()
            if cfg_path is not None:  # re-read the source's tables from the file
                r.reload(cfg_path)

        logging.getLogger("databus").info("relay %s capturing %s", cfg.name,
                                          redact_url(cfg.source.url))
        _serve_until_signal(r, reload)
    except DatabusError as exc:
        _fail(exc, redactor)


@app.command("signal")
def signal_cmd(
    kind: Annotated[str, typer.Argument(help="execute-snapshot, stop-snapshot, pause-snapshot"
                                              " or resume-snapshot")],
    relay: Annotated[str, typer.Option(help="relay URL, e.g. http://127.0.0.1:11115")],
    tables: Annotated[str | None, typer.Option(
        help="execute-snapshot: comma-separated regexes on db.table")] = None,
    data: Annotated[str | None, typer.Option(help="the signal's data as JSON")] = None,
) -> None:
    """Send a signal to a relay's source (incremental snapshots; see docs/snapshots.md)."""
    import httpx  # imported when run (see top)

    from databus.client.credentials import Credentials

    payload: dict[str, object] = {}
    if data:
        try:
            payload = json.loads(data)
        except ValueError as exc:
            raise typer.BadParameter(f"--data is not JSON: {exc}") from exc
    if tables:
        payload["data-collections"] = _regexes(tables)
    try:
        creds = Credentials.from_env()  # DATABUS_TOKEN(_FILE), DATABUS_CA_FILE, ...
        r = httpx.post(f"{relay.rstrip('/')}/signal", json={"type": kind, "data": payload},
                       timeout=30, headers=creds.headers(), verify=creds.ssl_context())
    except DatabusError as exc:
        _fail(exc)
    except httpx.HTTPError as exc:
        typer.echo(f"databus: relay {relay} unreachable: {exc}", err=True)
        raise typer.Exit(3) from exc
    if r.status_code != 202:
        typer.echo(f"databus: {r.text}", err=True)
        raise typer.Exit(2)
    typer.echo(r.json()["id"])


PartitionsOpt = Annotated[str | None, typer.Option(
    help="static client cluster: MOD:N splits every source's keys into N buckets; this"
    " process reads bucket --member (needs --sources)")]
MemberOpt = Annotated[int | None, typer.Option(help="with --partitions: this member's bucket,"
                                                    " 0 to N-1")]


@app.command()
def tail(
    relay: Annotated[str, typer.Option(
        help="relay URL (http://127.0.0.1:11115), comma-separated relays, or a relay"
        " cluster zk://HOST:PORT/NAME")],
    sources: Annotated[str | None, typer.Option(help="comma-separated source names or ids")] = None,
    from_start: Annotated[bool, typer.Option(help="start with the oldest window the relay holds")] = False,
    max_windows: Annotated[int | None, typer.Option(help="stop after this many windows")] = None,
    checkpoint: Annotated[Path | None, typer.Option(help="checkpoint file to resume from and keep")] = None,
    bootstrap: Annotated[str | None, typer.Option(
        help="bootstrap server URL: print the snapshot first (and use it if the relay "
        "no longer holds the checkpoint)")] = None,
    partitions: PartitionsOpt = None,
    member: MemberOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Print every change as a JSON envelope, one per line.

    Without --from-start (and without a stored checkpoint) it starts at the
    newest window: only changes committed from now on are printed.
    """
    from databus.client.runners import tail as run_tail  # imported when run (see top)

    redactor = _setup_logging(verbose)
    try:
        # an interactive command: give up on an unreachable relay after a few tries
        run_tail(relay, sys.stdout, sources=_csv(sources), checkpoint=checkpoint,
                 from_start=from_start, bootstrap_url=bootstrap, relay_max_retries=5,
                 max_windows=max_windows, stop=_stop_on_sigterm(), partitions=partitions,
                 member=member)
    except DatabusError as exc:
        _fail(exc, redactor)


@app.command()
def replicate(
    relay: Annotated[str, typer.Option(
        help="relay URL, comma-separated relays, or a relay cluster zk://HOST:PORT/NAME")],
    target: Annotated[str, typer.Option(help="SQLAlchemy URL of the target database")],
    sources: Annotated[str | None, typer.Option(help="comma-separated source names or ids")] = None,
    bootstrap: Annotated[str | None, typer.Option(
        help="bootstrap server URL: a new replica starts from its snapshot, and a replica "
        "the relay no longer holds catches up from it")] = None,
    bootstrap_batch: Annotated[int, typer.Option(
        help="snapshot rows / catch-up events per bootstrap request")] = 10_000,
    target_password_file: Annotated[Path | None, typer.Option(
        help="file whose first line is the target's password (keeps it out of the URL"
        " and the process list); DATABUS_TARGET_PASSWORD works too")] = None,
    partitions: PartitionsOpt = None,
    member: MemberOpt = None,
    group: Annotated[str | None, typer.Option(
        help="dynamic client group zk://HOST:PORT/GROUP: the group's members share"
        " --group-partitions partitions and rebalance as they come and go (needs"
        " --sources)")] = None,
    group_partitions: Annotated[int, typer.Option(help="partitions of the group")] = 8,
    member_id: Annotated[str | None, typer.Option(
        help="this member's name in its group (default: host-pid)")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Apply the change stream to same-named tables of a target database.

    Each window is applied in one target transaction together with the
    checkpoint (table databus_checkpoint), so a crash never applies a window
    twice or half.
    """
    from databus.client.runners import replicate as run_replicate  # imported when run

    redactor = _setup_logging(verbose, Redactor([url_password(target)]))
    try:
        target = _with_password(target, target_password_file, "DATABUS_TARGET_PASSWORD")
        redactor.add(url_password(target))
        if group is not None:
            from databus.client.runners import replicate_group

            if partitions is not None or bootstrap is not None:
                raise typer.BadParameter("--group takes neither --partitions nor --bootstrap")
            replicate_group(relay, target, group, sources=_csv(sources) or [],
                            partitions=group_partitions, member_id=member_id,
                            stop=_stop_on_sigterm())
            return
        run_replicate(relay, target, sources=_csv(sources), bootstrap_url=bootstrap,
                      bootstrap_batch_size=bootstrap_batch, stop=_stop_on_sigterm(),
                      partitions=partitions, member=member)
    except DatabusError as exc:
        _fail(exc, redactor)


@app.command()
def publish(
    relay: Annotated[str, typer.Option(
        help="relay URL, comma-separated relays, or a relay cluster zk://HOST:PORT/NAME")],
    bootstrap_servers: Annotated[str, typer.Option(help="Kafka brokers, HOST:PORT[,...]")],
    topic_prefix: Annotated[str, typer.Option(
        help="topics are <prefix>.<db>.<table> (Debezium's topic.prefix)")],
    name: Annotated[str | None, typer.Option(
        help="publisher name: transactional.id databus-publish-<name> and its position's"
        " key in the offsets topic (default: the topic prefix)")] = None,
    sources: Annotated[str | None, typer.Option(help="comma-separated source names or ids")] = None,
    offsets_topic: Annotated[str, typer.Option(
        help="compacted topic of the publishers' positions")] = "databus-publish-offsets",
    tombstones: Annotated[bool, typer.Option(
        help="a tombstone (null value) after each delete")] = True,
    transaction_metadata: Annotated[bool, typer.Option(
        help="BEGIN/END records on <prefix>.transaction")] = True,
    heartbeat_interval: Annotated[float, typer.Option(
        help="seconds idle before a heartbeat on __debezium-heartbeat.<prefix> (0: none)")] = 10.0,
    schemas_enable: Annotated[bool, typer.Option(
        help="JSON with the Kafka Connect schema part (schemas.enable)")] = True,
    value_mode: Annotated[str, typer.Option(
        help="column values: databus (docs/json.md) or debezium (as Debezium's MySQL"
        " connector)")] = "databus",
    decimal_handling_mode: Annotated[str, typer.Option(
        help="value-mode debezium: precise, string or double")] = "precise",
    time_precision_mode: Annotated[str, typer.Option(
        help="value-mode debezium: adaptive_time_microseconds or connect")] =
        "adaptive_time_microseconds",
    bigint_unsigned_handling_mode: Annotated[str, typer.Option(
        help="value-mode debezium: long or precise")] = "long",
    batch_windows: Annotated[int, typer.Option(
        help="whole windows per Kafka transaction at most (1: one per window)")] = 100,
    batch_linger: Annotated[float, typer.Option(
        help="seconds a transaction waits for more windows before it commits")] = 0.1,
    topic_partitions: Annotated[int, typer.Option(
        help="partitions of created data topics (-1: the broker's default)")] = -1,
    replication_factor: Annotated[int, typer.Option(
        help="replication factor of created topics (-1: the broker's default)")] = -1,
    create_topics: Annotated[bool, typer.Option(help="create missing topics")] = True,
    kafka_config: Annotated[Path | None, typer.Option(
        help="librdkafka properties file (key=value: security.protocol, sasl.*, ssl.*)")] = None,
    token_file: Annotated[Path | None, typer.Option(
        help="relay token file (default: DATABUS_TOKEN_FILE / DATABUS_TOKEN)")] = None,
    ca_file: Annotated[Path | None, typer.Option(
        help="PEM CA of the relay's certificate (default: DATABUS_CA_FILE)")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Publish the change stream into Kafka, whole windows per transaction.

    Topics, keys and values follow Debezium's (docs/kafka.md). Whole windows' messages
    and the publisher's position are committed in one Kafka transaction, so a publisher
    killed at any point resumes without loss and, for read_committed consumers,
    without duplicates.
    """
    redactor = _setup_logging(verbose)
    if not verbose:  # librdkafka's connection attempts: the errors are reported as ours
        logging.getLogger("databus.kafka.librdkafka").setLevel(logging.CRITICAL)
    try:
        from databus.kafka.config import PublishConfig, read_kafka_properties

        props = read_kafka_properties(kafka_config) if kafka_config is not None else {}
        redactor.add(*(v for k, v in props.items() if "password" in k or "secret" in k))
        cfg = PublishConfig(
            relay_url=relay, bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix,
            name=name, sources=_csv(sources), offsets_topic=offsets_topic,
            tombstones_on_delete=tombstones, transaction_metadata=transaction_metadata,
            heartbeat_interval=heartbeat_interval, schemas_enable=schemas_enable,
            value_mode=value_mode, decimal_handling_mode=decimal_handling_mode,
            time_precision_mode=time_precision_mode,
            bigint_unsigned_handling_mode=bigint_unsigned_handling_mode,
            batch_windows=batch_windows, batch_linger=batch_linger,
            topic_partitions=topic_partitions, topic_replication_factor=replication_factor,
            create_topics=create_topics, kafka_config=props, token_file=token_file,
            tls_ca_file=ca_file)
        try:
            from databus.kafka.publisher import run_publish  # imported when run
        except ImportError as exc:
            from databus.core.errors import ConfigError

            raise ConfigError("databus publish needs confluent-kafka: pip install"
                              " 'databus[kafka]'") from exc
        run_publish(cfg, stop=_stop_on_sigterm())
    except DatabusError as exc:
        _fail(exc, redactor)


@app.command(name="bootstrap")
def bootstrap_cmd(
    config: Annotated[Path, typer.Option(help="bootstrap YAML config file")],
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run a bootstrap service: producer, applier and server (docs/bootstrap.md)."""
    from databus.bootstrap.config import load_config  # imported when run (see top)
    from databus.bootstrap.service import BootstrapService

    redactor = _setup_logging(verbose)
    try:
        _private_files()
        cfg = load_config(config)
        redactor.add(url_password(cfg.store.url), url_password(cfg.store.connect_url()))
        service = BootstrapService(cfg)
        logging.getLogger("databus").info(
            "bootstrap %s: relay %s, store %s", cfg.name, cfg.relay_url,
            redact_url(cfg.store.url))
        _serve_until_signal(service, service.reload_tokens)
    except DatabusError as exc:
        _fail(exc, redactor)


@app.command(name="binlog-server")
def binlog_server(
    relay: Annotated[str | None, typer.Option(
        help="relay URL, comma-separated relays, or a relay cluster zk://HOST:PORT/NAME")] = None,
    port: Annotated[int | None, typer.Option(help="MySQL protocol port (default 3307)")] = None,
    user: Annotated[str | None, typer.Option(help="replication user name (default repl)")] = None,
    password_file: Annotated[Path | None, typer.Option(
        help="file whose first line is that user's password")] = None,
    data_dir: Annotated[Path | None, typer.Option(
        help="directory of the binlog files, index and position map")] = None,
    server_id: Annotated[int | None, typer.Option(help="@@server_id of the service")] = None,
    tables: Annotated[str | None, typer.Option(
        help="comma-separated db.table to convert (default: every table of the relay)")] = None,
    config: Annotated[Path | None, typer.Option(
        help="binlog service YAML config file (options given here win)")] = None,
    host: Annotated[str | None, typer.Option(help="address to bind (default 127.0.0.1)")] = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    tls_client_ca: TlsClientCaOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Serve a relay's changes as MySQL binlog files over the MySQL replication protocol,
    for binlog readers (python-mysql-replication, mariadb-binlog, Debezium, ...);
    docs/binlog-service.md."""
    redactor = _setup_logging(verbose)
    if not verbose:  # mysql-mimic logs every connection's start and end at INFO
        logging.getLogger("mysql_mimic").setLevel(logging.WARNING)
    try:
        try:
            from databus.binlog.config import BinlogServiceConfig
            from databus.binlog.server import run_service  # imported when run
        except ImportError as exc:
            from databus.core.errors import ConfigError

            raise ConfigError("databus binlog-server needs mysql-mimic: pip install"
                              " 'databus[binlog]'") from exc
        from databus.client.credentials import read_secret_file
        from databus.core.config import validate

        _private_files()
        raw: dict[str, object] = {}
        if config is not None:
            import yaml

            from databus.core.config import interpolate
            from databus.core.errors import ConfigError

            try:
                loaded = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise ConfigError(f"cannot read config {config}: {exc}") from exc
            if not isinstance(loaded, dict):
                raise ConfigError(f"config {config} must be a mapping")
            raw = interpolate(loaded)
        given = {"relay": relay, "port": port, "user": user, "password_file": password_file,
                 "data_dir": data_dir, "server_id": server_id, "host": host,
                 "tables": _csv(tables) if tables is not None else None}
        raw.update({k: str(v) if isinstance(v, Path) else v
                    for k, v in given.items() if v is not None})
        tls = _http_overrides(None, None, False, tls_cert, tls_key, tls_client_ca).get("tls")
        if tls is not None:
            raw["tls"] = tls
        if "relay" not in raw:
            raise typer.BadParameter("--relay (or relay: in --config) is required")
        cfg = validate(BinlogServiceConfig, raw, "binlog service")
        if cfg.password_file is None:
            from databus.core.errors import ConfigError

            raise ConfigError("--password-file (or password_file: in --config) is required")
        password = read_secret_file(cfg.password_file, "password file")
        redactor.add(password)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: threading.Thread(target=stop.set, daemon=True).start())
        logging.getLogger("databus").info("binlog service: relay %s, data %s, port %d",
                                          cfg.relay, cfg.data_dir, cfg.port)
        run_service(cfg, password, stop)
    except DatabusError as exc:
        _fail(exc, redactor)


cluster_app = typer.Typer(no_args_is_help=True, help="Relay clusters (docs/cluster.md)")
app.add_typer(cluster_app, name="cluster")


@cluster_app.command("status")
def cluster_status(
    address: Annotated[str, typer.Argument(help="zk://HOST:PORT[,HOST:PORT]/NAME")],
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Print a relay cluster's leader, epoch and members (their roles and positions)."""
    from databus.coord.zk import ClusterView, ZkAddress, zk_client

    try:
        addr = ZkAddress.parse(address)
        zk = zk_client(addr, connect_timeout=10.0)
        try:
            status = ClusterView(zk, addr).status()
        finally:
            zk.stop()
            zk.close()
    except DatabusError as exc:
        _fail(exc)
    if as_json:
        typer.echo(json.dumps(status, indent=2))
        return
    leader = status["leader"] or {}
    typer.echo(f"cluster {status['cluster']}: epoch {status['epoch']}, leader "
               f"{leader.get('id', '(none)')} {leader.get('url', '')}".rstrip())
    for m in status["members"]:
        typer.echo(f"  {m.get('id', '?'):<20} {m.get('role', '?'):<9} max_scn"
                   f" {m.get('max_scn', -1):<12} {m.get('url', '')}")


token_app = typer.Typer(no_args_is_help=True, help="Manage the bearer tokens of a token file"
                        " (servers re-read it on SIGHUP; docs/security.md).")
app.add_typer(token_app, name="token")
TokenFileArg = Annotated[Path, typer.Option(
    "--file", envvar="DATABUS_SERVER_TOKEN_FILE",
    help="the servers' token file (created 0600 if missing)")]


@token_app.command("add")
def token_add(
    name: Annotated[str, typer.Argument(help="who holds the token (letters, digits, _ -)")],
    file: TokenFileArg,
    tables: Annotated[str, typer.Option(
        help="comma-separated regexes of the tables it may read, e.g. 'shop\\..*'")] = "",
    admin: Annotated[bool, typer.Option("--admin", help="may signal and read /admin")] = False,
    replace: Annotated[bool, typer.Option(
        "--replace", help="rotate: replace an existing token of that name")] = False,
) -> None:
    """Add a token: print it once (stdout) and store only its hash."""
    from databus.auth import add_token  # imported when run (see top)

    os.umask(0o077)
    try:
        token = add_token(file, name, _regexes(tables), admin=admin, replace=replace)
    except DatabusError as exc:
        _fail(exc)
    typer.echo(token)
    typer.echo(f"databus: token {name!r} added to {file}; it is shown only now. Servers"
               " use it after their next start or SIGHUP.", err=True)


@token_app.command("remove")
def token_remove(
    name: Annotated[str, typer.Argument(help="the token's name")],
    file: TokenFileArg,
) -> None:
    """Revoke a token (servers stop accepting it at their next SIGHUP)."""
    from databus.auth import remove_token  # imported when run (see top)

    try:
        remove_token(file, name)
    except DatabusError as exc:
        _fail(exc)


@token_app.command("list")
def token_list(file: TokenFileArg) -> None:
    """Names, tables and admin flags of a token file (never the hashes)."""
    from databus.auth import read_grants  # imported when run (see top)

    try:
        grants = read_grants(file)
    except DatabusError as exc:
        _fail(exc)
    for g in grants.values():
        typer.echo(f"{g.name}\t{'admin' if g.admin else '-'}\t{','.join(g.tables)}")


@app.command()
def demo(
    transactions: Annotated[int, typer.Option(help="transactions the writer commits")] = 300,
    workdir: Annotated[Path, typer.Option(help="where the demo files go (recreated)")] = Path("demo-data"),
    quiet: Annotated[bool, typer.Option(help="do not print each change")] = False,
) -> None:
    """Run the SQLite -> relay -> consumers demo and check the replica."""
    from rich.console import Console  # imported when run (see top)

    from databus.demo import run_demo

    logging.basicConfig(level=logging.WARNING)
    try:
        ok = run_demo(workdir, transactions, quiet, Console())
    except DatabusError as exc:
        _fail(exc)
    raise typer.Exit(0 if ok else 1)


def main() -> None:
    """Entry point of the ``databus`` script."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
