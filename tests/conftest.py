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

import pytest

from databus.relay.relay import Relay
from tests.support.kafka import KafkaBroker
from tests.support.mariadb import MariaDB
from tests.support.memrelay import MemoryRelay
from tests.support.postgres import PostgreSQL
from tests.support.relays import make_relay
from tests.support.shop import create_shop
from tests.support.zookeeper import ZooKeeper


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (scripts/test.sh runs two workers): the Spark tests form one
    group, run by one worker, first, while the other worker takes the rest. One
    Spark JVM at a time (two would only fight over the two cores), and the longest
    run starts at once instead of last."""
    spark = [i for i in items if "/tests/spark/" in str(i.path)]
    if not spark:
        return
    for item in spark:
        item.add_marker(pytest.mark.xdist_group("spark"))
    others = [i for i in items if "/tests/spark/" not in str(i.path)]
    items[:] = spark + others


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
