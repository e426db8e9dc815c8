"""A fresh, uniquely named database on the system PostgreSQL (127.0.0.1:5432,
trust auth, user postgres), dropped afterwards, for tests that replicate into it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@contextmanager
def fresh_database(prefix: str = "databus_test") -> Iterator[str]:
    """Yields the SQLAlchemy URL of a new database; drops it (forcibly) at exit."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f"CREATE DATABASE {name}"))
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
        finally:
            with admin.connect() as conn:
                conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    finally:
        admin.dispose()
