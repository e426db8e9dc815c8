"""HTTP connection to a relay (``/sources``, ``/register``, ``/stream``).

Concurrency model: a :class:`RelayConnection` wraps one synchronous
``httpx.Client`` (a small keep-alive pool) and is used by one thread at a time,
the client's pull thread. Each ``/stream`` call blocks for at most the
long-poll ``timeout`` plus ``http_timeout``; a stop request is therefore seen
within that time.

Errors are typed (never inferred from message text):

* no connection, a timeout, a broken response, any 5xx ->
  :class:`~databus.core.errors.RelayUnavailableError` (transient);
* a server certificate that does not verify ->
  :class:`~databus.core.errors.TlsVerificationError` (terminal);
* a 4xx with the relay's JSON body ``{"error": code, "message": ...}`` -> the
  error class named by ``code`` (:func:`~databus.core.errors.error_from_code`),
  e.g. :class:`~databus.core.errors.ScnNotFoundError` for 410.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import string
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus

import httpx

from databus.client.credentials import Credentials, cert_failure, no_tls_context
from databus.client.endpoints import Endpoints
from databus.core.checkpoint import Checkpoint
from databus.core.errors import (
    DatabusError,
    RelayUnavailableError,
    ScnNotFoundError,
    TerminalError,
    TlsVerificationError,
    TransientError,
    error_from_code,
)
from databus.core.schema import SchemaRegistry

log = logging.getLogger("databus.client")


@dataclass(frozen=True, slots=True)
class StreamResponse:
    """A ``/stream`` body plus the relay's position headers (-1 when absent or not an
    integer): its buffer's newest and oldest window, the last whole window of the
    body, and when the body ends inside a window, that window and the
    ``windowOffset`` reached (see ``docs`` of ``GET /stream``)."""

    data: bytes
    max_scn: int = -1
    min_scn: int = -1
    cluster_hw: int | None = None  # to cluster members: what every member holds
    last_window_scn: int = -1
    partial_scn: int = -1
    partial_count: int = -1
    source_time_ns: int = -1  # the relay's "captured until" (docs/operations.md)
    windows_behind: int = -1  # windows the relay holds after this answer's
    prev_scn: int = -1  # to a flexible read: the newest window the relay no longer holds


# the position headers, lowercase, -> StreamResponse field
_POSITION_HEADERS = {b"x-databus-max-scn": "max_scn", b"x-databus-min-scn": "min_scn",
                     b"x-databus-cluster-hw": "cluster_hw",
                     b"x-databus-last-window-scn": "last_window_scn",
                     b"x-databus-partial-scn": "partial_scn",
                     b"x-databus-partial-count": "partial_count",
                     b"x-databus-source-time-ns": "source_time_ns",
                     b"x-databus-windows-behind": "windows_behind",
                     b"x-databus-prev-scn": "prev_scn"}

CONSUMER_HEADER = "X-Databus-Consumer"
"""The request header naming the consumer (the relay lists it at ``GET /consumers``)."""


def default_consumer() -> str:
    """``<host>-<pid>``: the name a reader that was given none sends."""
    return f"{socket.gethostname()}-{os.getpid()}"

# quote_plus(text, safe="") for ASCII text, as one str.translate in C: the
# checkpoint is quoted on every request
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
_QUOTE = {c: f"%{c:02X}" for c in range(128) if chr(c) not in _UNRESERVED}
_QUOTE[ord(" ")] = "+"


def quote_value(text: str) -> str:
    """``text`` encoded as a query string value: ``urllib.parse.quote_plus(text,
    safe="")``, which is what httpx does to a query parameter."""
    return text.translate(_QUOTE) if text.isascii() else quote_plus(text, safe="")


def stream_query(checkpoint: Checkpoint | None, source_ids: list[int] | None = None, *,
                 size: int = 4 * 1024 * 1024, filter_json: str | None = None,
                 timeout: float = 10.0, from_latest: bool = False) -> str:
    """The query string of a ``/stream`` request (see :meth:`RelayConnection.stream`):
    the checkpoint in its compact form (:meth:`Checkpoint.to_compact_json`)."""
    query = f"size={size}&output=binary&timeout={float(timeout)!r}"
    if source_ids:
        query += "&sources=" + "%2C".join(map(str, source_ids))
    if checkpoint is not None and not checkpoint.is_flexible:
        query += "&checkPoint=" + quote_value(checkpoint.to_compact_json())
    if filter_json:
        query += "&filters=" + quote_value(filter_json)
    if from_latest:
        query += "&streamFromLatestScn=true"
    return query


class RelayConnection:
    """A relay's HTTP API as typed calls. Use as a context manager or :meth:`close`."""

    def __init__(self, url: str, *, http_timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None,
                 credentials: Credentials | None = None,
                 headers: dict[str, str] | None = None, consumer: str | None = None) -> None:
        """``url``: a relay, a comma-separated list of relays or a cluster address
        ``zk://HOST:PORT/NAME`` (:mod:`databus.client.endpoints`): when the relay in use
        fails, the next call goes to another one. ``credentials``: the token and TLS
        files to present; None reads them from the environment
        (:meth:`Credentials.from_env`). ``consumer``: the name every request gives
        (``X-Databus-Consumer``; default :func:`default_consumer`)."""
        self.endpoints = Endpoints(url.rstrip("/"))
        self.url = self.endpoints.current
        self.http_timeout = http_timeout
        self._creds = credentials if credentials is not None else Credentials.from_env()
        self._transport = transport
        self.consumer = consumer or default_consumer()
        self._headers = {"User-Agent": "databus-client", CONSUMER_HEADER: self.consumer,
                         **self._creds.headers(), **(headers or {})}
        self._tls = any(u.startswith("https://") for u in (*self.endpoints.urls, self.url))
        self._http = self._client()
        self._timeouts: dict[float, dict[str, float | None]] = {}
        self.origin = ""
        """The relay's ``Databus-Origin`` (the captured database) as its last ``/sources``
        answer said ("" before, or when it sends none)."""

    def _client(self) -> httpx.Client:
        # a TLS context (shared per process, see credentials) only where a URL is
        # https://; building one for http:// cost ~25 ms per connection
        verify = self._creds.ssl_context() if self._tls else no_tls_context()
        return httpx.Client(base_url=self.url, timeout=self.http_timeout,
                            transport=self._transport, headers=self._headers, verify=verify)

    def close(self) -> None:
        self._http.close()
        self.endpoints.close()

    def _failed_over(self, avoid: frozenset[str] = frozenset()) -> None:
        """After a relay failure: the next call goes to the next member (one not in
        ``avoid`` when there is one), if any."""
        if self.endpoints.several:
            try:
                self.url = self.endpoints.advance(avoid)
            except RelayUnavailableError as exc:
                log.warning("no other relay to read: %s", exc)
                return
            if self.url.startswith("https://") and not self._tls:
                # a cluster member that serves TLS although the others did not
                self._tls = True
                self._http.close()
                self._http = self._client()
            else:
                self._http.base_url = httpx.URL(self.url)

    def __enter__(self) -> RelayConnection:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- calls ---------------------------------------------------------------

    def sources(self, names: list[str] | None = None) -> list[tuple[int, str]]:
        """``(id, "db.table")`` of every source the relay serves to this client (and
        :attr:`origin`); with ``names``, of those only: the relay answers ForbiddenError
        for one the token may not read, UnknownSourceError for one it does not serve (a
        relay from before ``names`` lists every source instead)."""
        r = self._get("/sources", {"names": ",".join(names)} if names else {})
        self.origin = r.headers.get("Databus-Origin", "")
        try:
            raw = r.json()
        except ValueError as exc:
            raise RelayUnavailableError(f"{self.url}/sources did not answer JSON") from exc
        if not isinstance(raw, list):
            raise RelayUnavailableError(f"{self.url}/sources did not answer a JSON list")
        try:
            return [(int(s["id"]), str(s["name"])) for s in raw]
        except (KeyError, TypeError, ValueError) as exc:
            raise RelayUnavailableError(f"{self.url}/sources answered malformed entries") from exc

    def register(self, source_ids: list[int] | None = None) -> SchemaRegistry:
        """All schema versions of ``source_ids`` (every source when None)."""
        params = {"sources": ",".join(map(str, source_ids))} if source_ids else {}
        return SchemaRegistry.from_json(self._get("/register", params).content)

    def stream(self, checkpoint: Checkpoint | None, source_ids: list[int] | None = None, *,
               size: int = 4 * 1024 * 1024, filter_json: str | None = None,
               timeout: float = 10.0, from_latest: bool = False,
               headers: dict[str, str] | None = None) -> StreamResponse:
        """Windows after ``checkpoint`` (None = flexible), long-polling ``timeout`` s.

        The body is concatenated binary events; empty when nothing new came
        within ``timeout``.
        """
        # the URL is built here in one string (httpx's params, URL merge and timeout
        # objects cost more per request than the rest of the request: bench.relay_fanout)
        query = stream_query(checkpoint, source_ids, size=size, filter_json=filter_json,
                             timeout=timeout, from_latest=from_latest)
        tried: set[str] = set()
        while True:
            base = self._http.base_url
            url = base.copy_with(raw_path=base.raw_path + b"stream?" + query.encode("ascii"))
            try:
                r = self._get("/stream", url=url, read_timeout=timeout + self.http_timeout,
                              headers=headers)
                break
            except ScnNotFoundError as exc:
                # Members hold the same windows but not as far back: one that has just
                # dropped its buffer (a cluster member that diverged) or has a smaller
                # one. The position is lost only when no member holds it.
                tried.add(self.url)
                missing = self.url
                self._failed_over(frozenset(tried))
                if self.url in tried:
                    raise
                log.warning("relay %s no longer holds this position (%s): reading %s,"
                            " another member", missing, exc, self.url)
        found: dict[str, int | None] = {}
        for name, value in r.headers.raw:
            field = _POSITION_HEADERS.get(name.lower())
            if field is not None:
                try:
                    found[field] = int(value)
                except ValueError:
                    found[field] = -1
        return StreamResponse(r.content, **found)  # type: ignore[arg-type]

    # -- plumbing ----------------------------------------------------------------

    def _json(self, path: str, params: dict[str, str]) -> Any:
        r = self._get(path, params)
        try:
            return r.json()
        except ValueError as exc:
            raise RelayUnavailableError(f"{self.url}{path} did not answer JSON") from exc

    def _get(self, path: str, params: dict[str, str] | None = None,
             read_timeout: float | None = None, headers: dict[str, str] | None = None,
             url: httpx.URL | None = None) -> httpx.Response:
        """GET ``path`` with ``params``, or the whole ``url`` when given (``path``
        then only names the call in errors)."""
        extensions = None
        if read_timeout is not None:
            timeout = self._timeouts.get(read_timeout)
            if timeout is None:
                timeout = httpx.Timeout(self.http_timeout, read=read_timeout).as_dict()
                if len(self._timeouts) < 64:
                    self._timeouts[read_timeout] = timeout
            extensions = {"timeout": timeout}
        try:
            request = self._http.build_request("GET", path if url is None else url,
                                               params=params, headers=headers,
                                               extensions=extensions)
            r = self._http.send(request)
        except httpx.HTTPError as exc:
            verify = cert_failure(exc)
            if verify is not None:  # the same certificate again: retrying cannot help
                raise TlsVerificationError(
                    f"relay {self.url}: its TLS certificate does not verify ({verify});"
                    " trust its CA with ca_file (--ca-file, caFile, DATABUS_CA_FILE)"
                ) from exc
            err = RelayUnavailableError(
                f"relay {self.url} unreachable ({path}): {type(exc).__name__}: {exc}")
            self._failed_over()
            raise err from exc
        if r.status_code >= 400:
            error = self._error(path, r)
            if isinstance(error, RelayUnavailableError):
                self._failed_over()
            raise error
        return r

    def _error(self, path: str, r: httpx.Response) -> DatabusError:
        code, message, fields = "", r.text[:500], None
        try:
            body = json.loads(r.content)
            if isinstance(body, dict):
                code = str(body.get("error", ""))
                message = str(body.get("message", message))
                if isinstance(body.get("fields"), dict):
                    fields = body["fields"]
        except ValueError:
            pass
        where = f"relay {self.url}{path} answered {r.status_code}"
        if r.status_code >= 500:
            err = error_from_code(code, message, fields) if code else None
            if isinstance(err, TransientError):
                return err
            return RelayUnavailableError(f"{where}: {code or 'error'}: {message}")
        if code:
            return error_from_code(code, message, fields)
        return TerminalError(f"{where}: {message}")
