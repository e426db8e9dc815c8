"""Errors as HTTP answers: one JSON body for every refusal and failure of a server.

Contract: :data:`EXCEPTION_HANDLERS` is given once to ``Starlette(...)``; endpoints
just raise.

* A :class:`~databus.core.errors.DatabusError` answers its ``http_status`` with
  ``{"error": <code>, "message": ...}`` (:func:`error_response`); clients rebuild
  the error type from ``error`` (:func:`databus.core.errors.error_from_code`).
* Any other exception answers 500 ``InternalError`` with the same body
  (:func:`internal_error_response`), then Starlette raises it on to the server, which
  logs the traceback, closes that connection and goes on serving.
* An unknown path answers 404 ``NotFound``, a wrong method 405 ``MethodNotAllowed``.

The guard (:mod:`databus.serving.guard`) and the direct routes
(:mod:`databus.serving.direct`) answer with the same two functions, so a request
refused before any endpoint runs gets the same body as one an endpoint refused.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ExceptionHandler

from databus.core.errors import DatabusError, error_body


def error_response(exc: DatabusError) -> JSONResponse:
    """The answer to ``exc``: its ``http_status`` and its body
    (:func:`databus.core.errors.error_body`: error, message, fields)."""
    return JSONResponse(error_body(exc), status_code=exc.http_status)


async def _databus_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, DatabusError)
    return error_response(exc)


def internal_error_response(exc: BaseException) -> JSONResponse:
    """The answer to an unexpected ``exc``: 500 ``InternalError`` (the caller raises
    ``exc`` on to the server, which logs the traceback)."""
    return JSONResponse({"error": "InternalError", "message": f"{type(exc).__name__}: {exc}"},
                        status_code=500)


async def _internal_error(_: Request, exc: Exception) -> Response:
    # no logging here: Starlette raises exc on to the server, which logs the traceback
    return internal_error_response(exc)


async def _not_found(request: Request, _: Exception) -> Response:
    return JSONResponse({"error": "NotFound", "message": f"no endpoint {request.url.path}"},
                        status_code=404)


async def _method_not_allowed(request: Request, _: Exception) -> Response:
    return JSONResponse({"error": "MethodNotAllowed",
                         "message": f"{request.method} not allowed"}, status_code=405)


EXCEPTION_HANDLERS: dict[Any, ExceptionHandler] = {
    DatabusError: _databus_error,
    Exception: _internal_error,
    404: _not_found,
    405: _method_not_allowed,
}
