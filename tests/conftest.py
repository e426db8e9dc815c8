"""The suite's one fixture module: private servers, SQL targets, SQLite shop databases
and in-process relays.

Servers that tests use as plain targets (a fresh database per test) start once per
session, privately (free port, temp dir), and stop at the end: ``postgres``,
``mariadb``, ``zookeeper`` and ``kafka``. Tests that need their own server settings (binlog options, restarts,
kills) build a ``tests.support.mariadb.MariaDB`` themselves. Every test that runs
against several SQL databases takes its list from ``SQL_KINDS`` through the
``sql_url`` fixture, so what runs where is decided here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from databus.relay.relay import Relay

try:  # imported here, not at session finish, by schemathesis' pytest plugin: see below
    import schemathesis.reporting.html.writer
    import schemathesis.reporting.junitxml  # noqa: F401
except ImportError:  # pragma: no cover - schemathesis is a dev dependency
    pass
# Why: pytest rewrites (compiles) a plugin module on its first import. That
# compile, at session finish while threads the Spark tests leave behind (py4j)
# still run Python code, failed a whole run once on CPython 3.11 with
# "SystemError: AST constructor recursion depth mismatch" after every test had
# passed; importing at collection time compiles before any such thread exists.
from tests.support.kafka import KafkaBroker
from tests.support.mariadb import MariaDB
from tests.support.memrelay import MemoryRelay
from tests.support.postgres import PostgreSQL
from tests.support.relays import make_relay
from tests.support.shop import create_shop
from tests.support.zookeeper import ZooKeeper


def _in_spark(path: object) -> bool:
    return "/tests/spark/" in str(path) or str(path).startswith("tests/spark/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The Spark tests first: under pytest-xdist their worker starts on them at once
    (they are the longest run) while the other worker takes the rest."""
    items[:] = [i for i in items if _in_spark(i.path)] + \
        [i for i in items if not _in_spark(i.path)]


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """scripts/test.sh runs two workers: every Spark test on one of them (one Spark JVM
    at a time: two would only fight over the two cores), likewise the Kafka publisher's
    e2e tests (one broker, which one of them restarts), any other test on either.
    (A scheduler of our own: xdist 3.8's ``loadgroup`` does not see its group markers
    under pytest 9.2, whose node ids it can no longer rewrite.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SparkApart(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if _in_spark(path):
                return "spark"
            return "kafka" if path.endswith("/test_kafka_publish.py") else nodeid

    return SparkApart(config, log)


SQL_KINDS = ("sqlite", "postgresql", "mariadb")
"""The SQL databases a store or sink is tested on (the ``sql_url`` fixture)."""


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgreSQL]:
    """A private PostgreSQL (wal_level=logical) shared by the session."""
    with PostgreSQL() as server:
        yield server


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDB]:
    """A private MariaDB (binlog on, default settings) shared by the session; tests
    that change settings, restart or kill a server make their own."""
    with MariaDB(tmp_path_factory.mktemp("mariadb") / "db") as server:
        yield server


@pytest.fixture(scope="session")
def zookeeper() -> Iterator[ZooKeeper]:
    """A private standalone ZooKeeper shared by the session (pinned Java bundle);
    tests that stop or pause it make their own."""
    with ZooKeeper() as server:
        yield server


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaBroker]:
    """A private single-node KRaft Kafka broker shared by the session (pinned Java bundle);
    each test uses its own topic prefix. A test that restarts it restarts the shared one
    and waits until it serves again."""
    with KafkaBroker() as broker:
        yield broker


@pytest.fixture(params=SQL_KINDS)
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The SQLAlchemy URL of a fresh, empty database of each kind in ``SQL_KINDS``
    (a new SQLite file, or a new database on the session's server, dropped after)."""
    kind = request.param
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'target.db'}"
        return
    server: PostgreSQL | MariaDB = request.getfixturevalue(
        "postgres" if kind == "postgresql" else "mariadb")
    with server.fresh_database() as url:
        yield url


@pytest.fixture
def shop_db(tmp_path: Path) -> Path:
    path = tmp_path / "shop.db"
    create_shop(path)
    return path


@pytest.fixture
def relay(shop_db: Path, tmp_path: Path) -> Iterator[Relay]:
    r = make_relay(shop_db, tmp_path)
    with r:
        yield r


@pytest.fixture
def memrelay() -> Iterator[MemoryRelay]:
    with MemoryRelay() as r:
        yield r
