"""The ``databus`` command line: :data:`app` and its entry point :func:`main`.

One module per group of commands (:mod:`.relay`, :mod:`.consume`, :mod:`.services`,
:mod:`.status`, :mod:`.tokens`); importing them registers their commands on the app (:mod:`.app`).
"""

from databus.cli import consume, relay, services, status, tokens  # noqa: F401 - registers
from databus.cli.app import app, main

__all__ = ["app", "main"]
