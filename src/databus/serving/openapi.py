"""Builders of each server's machine-readable API description (``GET /openapi.json``).

Contract: :func:`openapi_document` is an OpenAPI 3.0 document of the server's own
paths plus what every server shares: ``/health``, ``/health/live``, ``/health/ready`` and
``/openapi.json`` (all open), the operator's page ``/ui`` (HTML, behind the same token),
bearer authentication for everything else, and the package's version. Every
:func:`operation` lists, beside its answer, its typed errors and 401 and 403 with
the JSON error body of :mod:`databus.serving.errors` (:data:`ERROR_SCHEMA`). The
suite fuzzes each server from its document (tests/integration/test_openapi_fuzz.py),
so a path or parameter missing here goes untested there.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error", "message"],
    "properties": {"error": {"type": "string"}, "message": {"type": "string"},
                   "fields": {"type": "object", "description": "the error's context"
                              " (positions, names), when it has any"}}}


def query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    """An OpenAPI query parameter."""
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}


def operation(summary: str, *, params: list[dict[str, Any]] | None = None,
              ok: dict[str, Any] | None = None, ok_status: str = "200",
              errors: tuple[int, ...] = (400,), admin: bool = False,
              body: dict[str, Any] | None = None) -> dict[str, Any]:
    """An OpenAPI operation answering ``ok`` (JSON unless given a media map) or one of
    the typed errors; 401 and 403 are listed for every operation a token guards."""
    content = ok if ok is not None else {"application/json": {"schema": {}}}
    responses: dict[str, Any] = {ok_status: {"description": "OK", "content": content}}
    for status in (*errors, 401, 403):
        responses[str(status)] = {"description": "error", "content": {
            "application/json": {"schema": ERROR_SCHEMA}}}
    op: dict[str, Any] = {"summary": summary + (" (admin token)" if admin else ""),
                          "parameters": params or [], "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": True,
                             "content": {"application/json": {"schema": body}}}
    return op


def openapi_document(title: str, description: str,
                     paths: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """An OpenAPI 3.0 document with the parts every server shares (``/health``,
    bearer authentication)."""
    try:
        version = importlib.metadata.version("databus")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        version = "0"
    return {
        "openapi": "3.0.3",
        "info": {"title": title, "version": version, "description": description},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": {
            **paths,
            "/health": {"get": {**operation("Liveness; needs no token", errors=()),
                                "security": []}},
            "/health/live": {"get": {**operation("Liveness; needs no token", errors=()),
                                     "security": []}},
            "/health/ready": {"get": {**operation(
                "Readiness: 200 when the server does its job, else 503 with the failing"
                " checks; needs no token", errors=(503,)), "security": []}},
            "/openapi.json": {"get": {**operation("This description; needs no token",
                                                  errors=()), "security": []}},
            "/ui": {"get": operation(
                "The operator's page: one self-contained HTML page that reads this"
                " server's JSON endpoints (docs/operations.md, \"The page\")", errors=(),
                ok={"text/html": {"schema": {"type": "string"}}})},
        },
    }
