"""The ``databus`` Typer application and what its commands share.

Every command turns a :class:`~databus.core.errors.DatabusError` into a one-line
message on stderr and exit status 2 (terminal) or 3 (transient), never a
traceback. Commands parse options and call the part they run (the relay, the
runners of :mod:`databus.client.runners`, the bootstrap service); each imports
its part only when it runs, so a command does not load the others' dependencies
(the relay's sources and their drivers, SQLAlchemy, uvicorn), and ``--help`` stays
quick. Options are settings of the command's config model (:mod:`databus.cli.flags`).
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn, Protocol

import typer

from databus.core.errors import DatabusError
from databus.core.redact import RedactingFilter, Redactor


class HttpServiceLike(Protocol):
    def request_exit(self, *_: Any) -> None: ...

    def run(self) -> None: ...


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Databus for Python: change data capture relays, consumers and sinks.",
)


def setup_logging(verbose: bool, redactor: Redactor | None = None) -> Redactor:
    """Logging to stderr through the redaction filter; returns the redactor, to which a
    command adds its secrets as soon as it knows them. Deprecation warnings (an old
    spelling in a config file) are logged too."""
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
    warnings.simplefilter("default", DeprecationWarning)
    logging.captureWarnings(True)
    return redactor


def fail(exc: DatabusError, redactor: Redactor | None = None) -> NoReturn:
    """Exit with ``exc`` as one line: status 3 when it is transient, else 2."""
    text = f"databus: {exc.code}: {exc}"
    typer.echo(redactor(text) if redactor is not None else Redactor()(text), err=True)
    raise typer.Exit(3 if exc.retryable else 2)


def with_password(url: str, file: Path | None, env: str) -> str:
    """``url`` with the password from ``file`` (first line) or the environment variable
    ``env``; unchanged when neither is given."""
    from sqlalchemy.engine import make_url  # imported when run (see top)

    from databus.client.credentials import read_secret_file

    password = read_secret_file(file, "password file") if file is not None else os.environ.get(env)
    if not password:
        return url
    return make_url(url).set(password=password).render_as_string(hide_password=False)


def private_files() -> None:
    """Files and directories a server creates (buffers, state, checkpoints, stores,
    schema history) are its own: 0600 and 0700."""
    os.umask(0o077)


def serve_until_signal(service: HttpServiceLike, reload: Callable[[], None]) -> None:
    """SIGTERM and SIGINT stop ``service`` cleanly (exit 0); SIGHUP runs ``reload``."""
    signal.signal(signal.SIGTERM, service.request_exit)
    signal.signal(signal.SIGINT, service.request_exit)
    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=reload, daemon=True).start())
    service.run()


def stop_on_signals(*signals: int) -> threading.Event:
    """An event SIGTERM (and ``signals``) set. From a helper thread: a signal handler
    must not wait for a lock the thread it interrupted may hold (the event's own)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, *signals):
        signal.signal(sig, lambda *_: threading.Thread(target=stop.set, daemon=True).start())
    return stop


class Watched:
    """What a consumer command's metrics port shows: the clients its runner made
    (:meth:`client`) and the partitions' clients of a dynamic group (:meth:`group`)."""

    def __init__(self) -> None:
        self._sources: list[Callable[[], list[Any]]] = []
        self.grouped = False

    def client(self, client: Any) -> None:
        self._sources.append(lambda: [client])

    def group(self, group: Any) -> None:
        self.grouped = True
        self._sources.append(lambda: [p.client for p in list(group.running.values())])

    def metrics(self) -> list[Any]:
        return [c.metrics() for source in self._sources for c in source()]


@contextmanager
def consumer_metrics(service: str, values: Mapping[str, Any]) -> Iterator[Watched | None]:
    """With ``--metrics-port`` in ``values`` (a command's options): a listener serving
    ``/metrics`` and health for the clients the command's runner makes (tell it them
    through the :class:`Watched` yielded); else None."""
    port, host = values.get("metrics_port"), values.get("metrics_host")
    if port is None:
        if host is not None:
            raise typer.BadParameter("--metrics-host goes with --metrics-port")
        yield None
        return
    from databus.client.metrics import readiness, render
    from databus.serving.health import Check
    from databus.serving.metrics_port import MetricsServer

    watched = Watched()

    def checks() -> list[Check]:
        rows = watched.metrics()
        if not rows:  # a group member may own no partition: it waits, rightly
            return [Check("consumer", watched.grouped, "no partition owned"
                          if watched.grouped else "not started")]
        return [Check(*c) for c in readiness(rows)]

    server = MetricsServer(service, lambda: render(watched.metrics()), checks, port=port,
                           host=host or "127.0.0.1")
    with server:
        yield watched


def main() -> None:
    """Entry point of the ``databus`` script."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


# -- options shared by several commands -------------------------------------------------
#
# Servers (relay, bootstrap, binlog service): where they listen and whom they let in.
HostOpt = Annotated[str | None, typer.Option(
    help="address to bind (default 127.0.0.1; beyond loopback needs --token-file or"
    " --insecure)")]
ServerTokenFileOpt = Annotated[Path | None, typer.Option(
    "--token-file", help="bearer token file of this server (databus token add); re-read on"
    " SIGHUP")]
InsecureOpt = Annotated[bool | None, typer.Option(
    "--insecure", help="serve beyond loopback without tokens (warned at every start)")]
TlsCertOpt = Annotated[Path | None, typer.Option(help="TLS: PEM certificate (chain)")]
TlsKeyOpt = Annotated[Path | None, typer.Option(help="TLS: PEM private key")]
TlsClientCaOpt = Annotated[Path | None, typer.Option(
    help="mutual TLS: PEM CA client certificates must chain to")]
SERVER_FLAGS = {"host": "host", "token_file": "token_file", "insecure": "insecure",
                "tls_cert": "tls.cert_file", "tls_key": "tls.key_file",
                "tls_client_ca": "tls.client_ca_file"}
"""The server options above -> fields of :class:`databus.serving.HttpServerConfig`."""

# Clients of a relay: the fields of databus.core.access.RelayAccess.
RelayOpt = Annotated[str, typer.Option(
    help="relay URL (http://127.0.0.1:11115), comma-separated relays, or a relay"
    " cluster zk://HOST:PORT/NAME")]
RelayTokenFileOpt = Annotated[Path | None, typer.Option(
    "--token-file", help="file holding the token for the relay (default: DATABUS_TOKEN /"
    " DATABUS_TOKEN_FILE)")]
CaFileOpt = Annotated[Path | None, typer.Option(
    help="PEM CA(s) the relay's certificate must chain to (default: DATABUS_CA_FILE)")]
CertFileOpt = Annotated[Path | None, typer.Option(
    help="client certificate for a relay that asks for one (default: DATABUS_CERT_FILE)")]
KeyFileOpt = Annotated[Path | None, typer.Option(
    help="its private key (default: DATABUS_KEY_FILE)")]
RELAY_ACCESS_FLAGS = {"relay": "relay.url", "token_file": "relay.token_file",
                      "ca_file": "relay.ca_file", "cert_file": "relay.cert_file",
                      "key_file": "relay.key_file"}
"""The relay options above -> fields of a model's ``relay`` section (RelayAccess)."""

VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="debug log lines")]

# Consumer commands: their own /metrics and health listener (docs/operations.md).
MetricsPortOpt = Annotated[int | None, typer.Option(
    min=0, max=65535, help="serve /metrics and /health/ready on this port (0: a free one,"
    " logged)")]
MetricsHostOpt = Annotated[str | None, typer.Option(
    help="address the metrics port binds (default 127.0.0.1; 0.0.0.0 for a scraper on"
    " another host)")]

RELAY_CLIENT_OPTIONS: dict[str, Any] = {
    "token_file": RelayTokenFileOpt, "ca_file": CaFileOpt, "cert_file": CertFileOpt,
    "key_file": KeyFileOpt, "metrics_port": MetricsPortOpt, "metrics_host": MetricsHostOpt}
"""The options every long-running reader of a relay takes, declared once."""

Command = Callable[..., None]


def relay_client(command: Command) -> Command:
    """Gives ``command`` (it reads a relay: tail, replicate, publish, binlog-server) the
    options of :data:`RELAY_CLIENT_OPTIONS`, placed before ``--verbose``. Typer builds a
    command's options from its signature: this sets one with them added; the command
    takes them as ``**options`` (keyword arguments), one place to declare them."""
    sig = inspect.signature(command, eval_str=True)
    own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    added = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                               annotation=kind) for name, kind in RELAY_CLIENT_OPTIONS.items()]
    last = [p for p in own if p.name == "verbose"]
    first = [p for p in own if p.name != "verbose"]
    setattr(command, "__signature__", sig.replace(parameters=[*first, *added, *last]))  # noqa: B010
    return command
