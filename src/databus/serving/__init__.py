"""databus.serving: the HTTP server plumbing the relay and the bootstrap server share.

One concept per module, each stating its contract:

* :mod:`~databus.serving.config`: the ``http:`` settings of a server
  (:class:`HttpServerConfig`) and its TLS (:class:`TlsServerConfig`).
* :mod:`~databus.serving.service`: the lifecycle, :class:`HttpService` (uvicorn on a
  socket it binds, beside the subclass's worker threads; the token rule at start).
* :mod:`~databus.serving.guard`: the ASGI layer every request passes first (tokens,
  admin paths, request limits, slow readers); :func:`principal` and
  :func:`readable_ids` say what a request may read.
* :mod:`~databus.serving.loopback`: the one rule of what is loopback
  (:func:`is_loopback`), asked by the token rule and the Host check alike.
* :mod:`~databus.serving.params`: query parameters parsed or refused as typed errors.
* :mod:`~databus.serving.errors`: every error as one JSON answer
  (:data:`EXCEPTION_HANDLERS`, registered once per app).
* :mod:`~databus.serving.requests`: the checks of a state-changing request
  (:func:`json_body`).
* :mod:`~databus.serving.openapi`: the builders of each server's ``/openapi.json``.
* :mod:`~databus.serving.direct`: the connection protocol (request-head deadline, GET
  routes answered on the connection itself).
* :mod:`~databus.serving.health`: ``/health/live`` and ``/health/ready``
  (:func:`health_routes`, :class:`Check`).
* :mod:`~databus.serving.metrics_port`: a process's own listener for ``/metrics`` and
  health (:class:`MetricsServer`: the consumer commands' ``--metrics-port``).

What every server will share next (its page) gets a module of its own beside these.
This file only hands names on: importing
``X`` from :mod:`databus.serving` is importing it from its module.

The package imports only :mod:`databus.core` and :mod:`databus.auth`: the relay and
the bootstrap service both build on it without knowing each other.
"""

from __future__ import annotations

from databus.serving.config import HttpServerConfig, TlsServerConfig
from databus.serving.errors import EXCEPTION_HANDLERS, error_response, internal_error_response
from databus.serving.guard import principal, readable_ids
from databus.serving.health import Check, health_routes
from databus.serving.loopback import host_name, is_loopback
from databus.serving.metrics_port import MetricsServer
from databus.serving.openapi import ERROR_SCHEMA, openapi_document, operation, query
from databus.serving.params import (
    MAX_SOURCE_IDS,
    bool_param,
    float_param,
    int_param,
    source_ids_param,
)
from databus.serving.requests import json_body
from databus.serving.service import HttpService

__all__ = [
    "ERROR_SCHEMA",
    "EXCEPTION_HANDLERS",
    "MAX_SOURCE_IDS",
    "Check",
    "HttpServerConfig",
    "HttpService",
    "MetricsServer",
    "TlsServerConfig",
    "bool_param",
    "error_response",
    "float_param",
    "health_routes",
    "host_name",
    "int_param",
    "internal_error_response",
    "is_loopback",
    "json_body",
    "openapi_document",
    "operation",
    "principal",
    "query",
    "readable_ids",
    "source_ids_param",
]
