"""The checks of a state-changing request (a ``POST`` such as the relay's ``/signal``)
before its body is used.

Contract of :func:`json_body`, in this order:

* ``Content-Type: application/json`` only (415 otherwise): a browser's cross-site form
  post cannot send it without a CORS preflight, which no server here answers.
* A request that reached the server at a loopback address (the connection's local
  address: every request to a server bound to loopback, and those that came over
  ``lo`` to a wildcard-bound one) needs a loopback ``Host`` (403 otherwise): a web
  page the operator opens, even one whose name was rebound to 127.0.0.1 (DNS
  rebinding), names its own host there, so it cannot drive a local server. Loopback
  is the one rule of :mod:`databus.serving.loopback`, the one the token rule asks
  too (:class:`~databus.serving.service.HttpService`): a server that may run without
  tokens is one this check guards. At any other address the server has tokens (or
  runs ``insecure``), and a ``Host`` may name it by any name.
* An ``Origin``, when sent, naming this server's ``Host`` (403 otherwise).
* A body of at most ``max_bytes`` and JSON nested at most
  :data:`databus.core.jsonsafe.MAX_DEPTH` levels (400 otherwise); an empty body is
  ``{}``.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from databus.core import jsonsafe
from databus.core.errors import ForbiddenError, InvalidRequestError, UnsupportedMediaTypeError
from databus.serving.loopback import host_name, is_loopback


async def json_body(request: Request, *, max_bytes: int = 1 << 20) -> Any:
    """The body of a state-changing request, checked (see the module docstring) and
    parsed."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise UnsupportedMediaTypeError(
            f"{request.url.path} takes Content-Type: application/json, got {ctype or 'none'}")
    host = request.headers.get("host", "")
    bound = request.scope.get("server")
    if bound and is_loopback(str(bound[0])) and not is_loopback(host_name(host)):
        raise ForbiddenError(f"Host {host!r} is not this server's (loopback)")
    origin = request.headers.get("origin")
    if origin is not None and origin.split("://", 1)[-1].rstrip("/") != host:
        raise ForbiddenError(f"Origin {origin!r} is not this server's ({host})")
    raw = await request.body()
    if len(raw) > max_bytes:
        raise InvalidRequestError(f"request body larger than {max_bytes} bytes")
    try:
        return jsonsafe.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"request body is not acceptable JSON: {exc}") from exc
