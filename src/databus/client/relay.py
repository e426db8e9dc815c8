"""HTTP connection to a relay (``/sources``, ``/register``, ``/stream``).

Concurrency model: a :class:`RelayConnection` wraps one synchronous
``httpx.Client`` (a small keep-alive pool) and is used by one thread at a time,
the client's pull thread. Each ``/stream`` call blocks for at most the
long-poll ``timeout`` plus ``http_timeout``; a stop request is therefore seen
within that time.

Errors are typed (never inferred from message text):

* no connection, a timeout, a broken response, any 5xx ->
  :class:`~databus.core.errors.RelayUnavailableError` (transient);
* a 4xx with the relay's JSON body ``{"error": code, "message": ...}`` -> the
  error class named by ``code`` (:func:`~databus.core.errors.error_from_code`),
  e.g. :class:`~databus.core.errors.ScnNotFoundError` for 410.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import httpx

from databus.client.credentials import Credentials, no_tls_context
from databus.client.endpoints import Endpoints
from databus.core.checkpoint import Checkpoint
from databus.core.errors import (
    DatabusError,
    RelayUnavailableError,
    TerminalError,
    TransientError,
    error_from_code,
)
from databus.core.schema import SchemaRegistry

log = logging.getLogger("databus.client")


@dataclass(frozen=True, slots=True)
class StreamResponse:
    """A ``/stream`` body plus the relay's position headers (-1 when absent)."""

    data: bytes
    max_scn: int = -1
    min_scn: int = -1
    cluster_hw: int | None = None  # to cluster members: what every member holds


def _header_int(headers: httpx.Headers, name: str) -> int:
    try:
        return int(headers.get(name, "-1"))
    except ValueError:
        return -1


class RelayConnection:
    """A relay's HTTP API as typed calls. Use as a context manager or :meth:`close`."""

    def __init__(self, url: str, *, http_timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None,
                 credentials: Credentials | None = None,
                 headers: dict[str, str] | None = None) -> None:
        """``url``: a relay, a comma-separated list of relays or a cluster address
        ``zk://HOST:PORT/NAME`` (:mod:`databus.client.endpoints`): when the relay in use
        fails, the next call goes to another one. ``credentials``: the token and TLS
        files to present; None reads them from the environment
        (:meth:`Credentials.from_env`)."""
        self.endpoints = Endpoints(url.rstrip("/"))
        self.url = self.endpoints.current
        self.http_timeout = http_timeout
        self._creds = credentials if credentials is not None else Credentials.from_env()
        self._transport = transport
        self._headers = {"User-Agent": "databus-client", **self._creds.headers(),
                         **(headers or {})}
        self._tls = any(u.startswith("https://") for u in (*self.endpoints.urls, self.url))
        self._http = self._client()

    def _client(self) -> httpx.Client:
        # a TLS context (shared per process, see credentials) only where a URL is
        # https://; building one for http:// cost ~25 ms per connection
        verify = self._creds.ssl_context() if self._tls else no_tls_context()
        return httpx.Client(base_url=self.url, timeout=self.http_timeout,
                            transport=self._transport, headers=self._headers, verify=verify)

    def close(self) -> None:
        self._http.close()
        self.endpoints.close()

    def _failed_over(self) -> None:
        """After a relay failure: the next call goes to the next member, if any."""
        if self.endpoints.several:
            try:
                self.url = self.endpoints.advance()
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

    def sources(self) -> list[tuple[int, str]]:
        """``(id, "db.table")`` of every source the relay serves."""
        raw = self._json("/sources", {})
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
        params: dict[str, str] = {"size": str(size), "output": "binary",
                                  "timeout": repr(float(timeout))}
        if source_ids:
            params["sources"] = ",".join(map(str, source_ids))
        if checkpoint is not None and not checkpoint.is_flexible:
            params["checkPoint"] = checkpoint.to_json()
        if filter_json:
            params["filters"] = filter_json
        if from_latest:
            params["streamFromLatestScn"] = "true"
        r = self._get("/stream", params, read_timeout=timeout + self.http_timeout,
                      headers=headers)
        hw = r.headers.get("X-Databus-Cluster-Hw")
        return StreamResponse(r.content, _header_int(r.headers, "X-Databus-Max-Scn"),
                              _header_int(r.headers, "X-Databus-Min-Scn"),
                              _header_int(r.headers, "X-Databus-Cluster-Hw") if hw else None)

    # -- plumbing ----------------------------------------------------------------

    def _json(self, path: str, params: dict[str, str]) -> Any:
        r = self._get(path, params)
        try:
            return r.json()
        except ValueError as exc:
            raise RelayUnavailableError(f"{self.url}{path} did not answer JSON") from exc

    def _get(self, path: str, params: dict[str, str], read_timeout: float | None = None,
             headers: dict[str, str] | None = None) -> httpx.Response:
        timeout = (httpx.Timeout(self.http_timeout, read=read_timeout)
                   if read_timeout is not None else httpx.USE_CLIENT_DEFAULT)
        try:
            r = self._http.get(path, params=params, timeout=timeout, headers=headers)
        except httpx.HTTPError as exc:
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
        code, message = "", r.text[:500]
        try:
            body = json.loads(r.content)
            if isinstance(body, dict):
                code = str(body.get("error", ""))
                message = str(body.get("message", message))
        except ValueError:
            pass
        where = f"relay {self.url}{path} answered {r.status_code}"
        if r.status_code >= 500:
            err = error_from_code(code, message) if code else None
            if isinstance(err, TransientError):
                return err
            return RelayUnavailableError(f"{where}: {code or 'error'}: {message}")
        if code:
            return error_from_code(code, message)
        return TerminalError(f"{where}: {message}")
