"""SQLAlchemy engines for tests, as context managers (disposed at exit)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa


@contextmanager
def sql_engine(url: str, **kw: Any) -> Iterator[sa.Engine]:
    """``sa.create_engine(url, **kw)``, disposed at exit."""
    eng = sa.create_engine(url, **kw)
    try:
        yield eng
    finally:
        eng.dispose()
