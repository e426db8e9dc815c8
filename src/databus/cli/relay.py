"""``databus relay``, ``databus signal`` and ``databus cluster status``."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from databus.cli.app import (
    RELAY_ACCESS_FLAGS,
    SERVER_FLAGS,
    CaFileOpt,
    CertFileOpt,
    HostOpt,
    InsecureOpt,
    KeyFileOpt,
    RelayOpt,
    RelayTokenFileOpt,
    ServerTokenFileOpt,
    TlsCertOpt,
    TlsClientCaOpt,
    TlsKeyOpt,
    VerboseOpt,
    app,
    fail,
    private_files,
    serve_until_signal,
    setup_logging,
)
from databus.cli.flags import regexes, settings
from databus.core.errors import DatabusError
from databus.core.redact import Redactor, redact_url, url_password

if TYPE_CHECKING:
    from databus.relay.config import RelayConfig

RELAY_FLAGS = {
    "name": "name", "source": "source.url", "tables": "source.tables",
    "snapshot_mode": "source.snapshot_mode", "password_file": "source.password_file",
    "server_id": "source.server_id", "slot": "source.slot",
    "publication": "source.publication", "create_publication": "source.create_publication",
    "port": "http.port", **{k: f"http.{v}" for k, v in SERVER_FLAGS.items()},
    "buffer_path": "buffer.path", "buffer_size": "buffer.capacity_bytes",
    "state_dir": "state_dir",
    "cluster": "cluster.address", "member_id": "cluster.member_id",
    "advertise_url": "cluster.advertise_url",
}
"""``databus relay``'s options -> fields of :class:`databus.relay.config.RelayConfig`."""


def relay_config(config: Path | None, values: Mapping[str, Any]) -> RelayConfig:
    """The relay's config: the ``config`` file with the options given laid over it, or,
    without a file, the options alone (``--source`` needed)."""
    from databus.core.config import merged, read_file
    from databus.core.errors import ConfigError
    from databus.relay.config import parse_config

    over = settings({**values, "tables": regexes(values.get("tables"))}, RELAY_FLAGS)
    if config is None:
        if "url" not in over.get("source", {}):
            raise typer.BadParameter("--config or --source is required")
        return parse_config(over)
    try:
        return parse_config(merged(read_file(config), over))
    except ConfigError as exc:
        raise ConfigError(f"{config} with the options given: {exc}") from exc


@app.command()
def relay(
    config: Annotated[Path | None, typer.Option(
        help="relay YAML config file; options given here win over it")] = None,
    name: Annotated[str | None, typer.Option(
        help="this relay's name: its state files, MySQL server id, PostgreSQL slot and"
        " SQLite registration derive from it (default: derived from the source and"
        " buffer)")] = None,
    source: Annotated[str | None, typer.Option(
        help="source URL: sqlite:///shop.db, mysql://USER@HOST:PORT,"
        " postgresql://USER@HOST:PORT/DB, or databus+http://HOST:PORT")] = None,
    tables: Annotated[str | None, typer.Option(help="comma-separated tables to capture")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (default 11115)")] = None,
    buffer_path: Annotated[Path | None, typer.Option(help="persistent buffer file")] = None,
    buffer_size: Annotated[int | None, typer.Option(help="buffer capacity in bytes")] = None,
    state_dir: Annotated[Path | None, typer.Option(
        help="where the relay keeps its state (default: beside the buffer file)")] = None,
    snapshot_mode: Annotated[str | None, typer.Option(
        help="initial (default), initial_only, no_data, when_needed or always")] = None,
    password_file: Annotated[Path | None, typer.Option(
        help="file whose first line is the source password (keeps it out of the URL)")] = None,
    server_id: Annotated[int | None, typer.Option(
        help="MySQL/MariaDB: the replica server id (unique among the server's replicas)")
        ] = None,
    slot: Annotated[str | None, typer.Option(
        help="PostgreSQL: the replication slot (default databus_<relay name>)")] = None,
    publication: Annotated[str | None, typer.Option(
        help="PostgreSQL: the publication covering the tables")] = None,
    create_publication: Annotated[bool | None, typer.Option(
        "--create-publication", help="PostgreSQL: create (or extend) the publication if"
        " needed")] = None,
    host: HostOpt = None,
    token_file: ServerTokenFileOpt = None,
    insecure: InsecureOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    tls_client_ca: TlsClientCaOpt = None,
    cluster: Annotated[str | None, typer.Option(
        help="join a relay cluster: zk://HOST:PORT[,HOST:PORT]/NAME (docs/cluster.md)")] = None,
    member_id: Annotated[str | None, typer.Option(
        help="this relay's name in its cluster (default: HOST-PID)")] = None,
    advertise_url: Annotated[str | None, typer.Option(
        help="the URL other members and clients reach this relay at")] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Run a relay: capture a source (a database, or another relay with
    --source databus+http://HOST:PORT) and serve its changes over HTTP."""
    values = dict(locals())
    redactor = setup_logging(verbose, Redactor([url_password(source or "")]))
    try:
        private_files()
        cfg = relay_config(config, values)
        from databus.relay.relay import Relay  # imported when run (see the app's docstring)
        from databus.sources.config import ServerSourceConfig

        redactor.add(url_password(cfg.source.url))
        if isinstance(cfg.source, ServerSourceConfig):
            redactor.add(cfg.source.password())
        r = Relay(cfg)

        def reload() -> None:
            r.reload_tokens()
            if config is not None:  # the file again, with the same options over it
                try:
                    r.reload(relay_config(config, values))
                except DatabusError as exc:
                    logging.getLogger("databus.relay").error("config not reloaded: %s", exc)

        logging.getLogger("databus").info("relay %s capturing %s", r.identity.name,
                                          redact_url(cfg.source.url))
        serve_until_signal(r, reload)
    except DatabusError as exc:
        fail(exc, redactor)


SIGNAL_FLAGS = {k: v.removeprefix("relay.") for k, v in RELAY_ACCESS_FLAGS.items()}
"""``databus signal``'s relay options -> :class:`databus.core.access.RelayAccess`."""


@app.command("signal")
def signal_cmd(
    kind: Annotated[str, typer.Argument(help="execute-snapshot, stop-snapshot, pause-snapshot"
                                              " or resume-snapshot")],
    relay: RelayOpt,
    tables: Annotated[str | None, typer.Option(
        help="execute-snapshot: comma-separated regexes on db.table")] = None,
    data: Annotated[str | None, typer.Option(help="the signal's data as JSON")] = None,
    token_file: RelayTokenFileOpt = None,
    ca_file: CaFileOpt = None,
    cert_file: CertFileOpt = None,
    key_file: KeyFileOpt = None,
) -> None:
    """Send a signal to a relay's source (incremental snapshots; see docs/snapshots.md).
    Prints the signal's id."""
    import httpx  # imported when run (see the app's docstring)

    from databus.client.credentials import Credentials
    from databus.core.access import RelayAccess
    from databus.core.config import validate

    payload: dict[str, object] = {}
    if data:
        try:
            payload = json.loads(data)
        except ValueError as exc:
            raise typer.BadParameter(f"--data is not JSON: {exc}") from exc
        if not isinstance(payload, dict):
            raise typer.BadParameter("--data must be a JSON object")
    if tables:
        payload["data-collections"] = regexes(tables)
    try:
        access = validate(RelayAccess, settings(locals(), SIGNAL_FLAGS), "relay")
        creds = Credentials.from_env(**access.credential_fields())
        if access.url.startswith("zk://"):
            raise typer.BadParameter("--relay: a signal goes to one relay (the cluster's"
                                     " leader, see databus cluster status), not zk://")
        url = access.url.split(",")[0]
        r = httpx.post(f"{url}/signal", json={"type": kind, "data": payload},
                       timeout=30, headers=creds.headers(), verify=creds.ssl_context())
    except DatabusError as exc:
        fail(exc)
    except httpx.HTTPError as exc:
        from databus.client.credentials import cert_failure

        verify = cert_failure(exc)
        if verify is not None:
            typer.echo(f"databus: TlsVerification: relay {relay}: its TLS certificate does"
                       f" not verify ({verify}); trust its CA with --ca-file", err=True)
            raise typer.Exit(2) from exc
        typer.echo(f"databus: relay {relay} unreachable: {exc}", err=True)
        raise typer.Exit(3) from exc
    if r.status_code != 202:
        typer.echo(f"databus: {r.text}", err=True)
        raise typer.Exit(2)
    typer.echo(r.json()["id"])


cluster_app = typer.Typer(no_args_is_help=True, help="Relay clusters (docs/cluster.md)")
app.add_typer(cluster_app, name="cluster")


@cluster_app.command("status")
def cluster_status(
    address: Annotated[str, typer.Argument(help="zk://HOST:PORT[,HOST:PORT]/NAME")],
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Print a relay cluster's leader, epoch and members (their roles and positions)."""
    from databus.coord import ClusterView, ZkAddress, connect

    try:
        addr = ZkAddress.parse(address)
        session = connect(addr, connect_timeout=10.0)
        try:
            status = ClusterView(session, addr).status()
        finally:
            session.close()
    except DatabusError as exc:
        fail(exc)
    for m in status["members"]:
        m["healthy"] = member_healthy(m)
    if as_json:
        typer.echo(json.dumps(status, indent=2))
        return
    leader = status["leader"] or {}
    typer.echo(f"cluster {status['cluster']}: epoch {status['epoch']}, leader "
               f"{leader.get('id', '(none)')} {leader.get('url', '')}".rstrip())
    if leader and not leader.get("healthy", True):
        typer.echo(f"  leader {leader.get('id')} is NOT capturing:"
                   f" {(leader.get('capture') or {}).get('error') or 'capture stopped'}")
    for m in status["members"]:
        capture = (m.get("capture") or {}).get("state", "?")
        health = "healthy" if m["healthy"] else "UNHEALTHY"
        typer.echo(f"  {m.get('id', '?'):<20} {m.get('role', '?'):<9} capture"
                   f" {capture:<9} {health:<9} max_scn {m.get('max_scn', -1):<12}"
                   f" {m.get('url', '')}")


def member_healthy(member: dict[str, Any]) -> bool:
    """A cluster member is healthy while its capture runs: a leader (or co-leader) from
    the database, a follower from its leader (docs/operations.md, "Health")."""
    capture = member.get("capture") or {}
    want = "upstream" if member.get("role") == "follower" else "database"
    return capture.get("state") == "running" and capture.get("reads") == want
