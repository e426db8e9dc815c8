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

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

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

# Property tests keep their example counts; the per-example deadline (200 ms) is off: on
# a loaded 2-core machine with 4 workers a slow example is the machine, not the code.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


def _needs_spark(item: pytest.Item) -> bool:
    """A test that runs in the session's Spark JVM (the ``spark`` fixture, directly or
    through another fixture); the other tests under tests/spark need no JVM."""
    return "spark" in getattr(item, "fixturenames", ())


def _rank(item: pytest.Item) -> int:
    """The order tests start in, longest first (so no long test starts last and runs
    alone): the Spark tests (the longest chain: one JVM, one worker), then the tests
    marked ``slow``, the other end-to-end tests, integration, then the rest (short: they
    fill the workers' ends evenly)."""
    if _needs_spark(item):
        return 0
    if item.get_closest_marker("slow") is not None:
        return 1
    folder = Path(str(item.path)).parent.name
    return {"e2e": 2, "integration": 3}.get(folder, 4)


_GROUPS = "databus_groups"
"""The key of ``workerinput`` naming the folder where each worker lists the tests that
need the Spark JVM (the controller's scheduler reads it: it sees node ids only)."""
_groups_key = pytest.StashKey[Path]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: within a rank, pytest's order (module fixtures kept)
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and _GROUPS in workerinput:
        listing = Path(workerinput[_GROUPS]) / str(workerinput["workerid"])
        tmp = listing.with_suffix(".tmp")
        tmp.write_text("\n".join(i.nodeid for i in items if _needs_spark(i)))
        tmp.replace(listing)  # whole or absent: the scheduler may read it at any time after


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hooks: absent without it
def pytest_configure_node(node: Any) -> None:
    folder = node.config.stash.get(_groups_key, None)
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="databus-xdist-groups-"))
        node.config.stash[_groups_key] = folder
        node.config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    node.workerinput[_GROUPS] = str(folder)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Any number of workers (scripts/test.sh): every test that needs the Spark JVM on one
    of them (one Spark JVM at a time: two would only fight over the two cores), likewise
    the Kafka publisher's e2e tests (one broker, which one of them restarts), any other
    test on any worker, one at a time, in the order ``_rank`` gives.
    (A scheduler of our own: xdist 3.8's ``loadgroup`` does not see its group markers
    under pytest 9.2, whose node ids it can no longer rewrite.)"""
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):  # type: ignore[misc]
        spark: set[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            # called once every worker has collected, so their listings are written
            if self.spark is None:
                folder = config.stash.get(_groups_key, None)
                listings = sorted(folder.iterdir()) if folder is not None else []
                self.spark = {n for f in listings if f.suffix != ".tmp"
                              for n in f.read_text().splitlines()}
            path = nodeid.split("::", 1)[0]
            if nodeid in self.spark or (not self.spark and path.startswith("tests/spark/")):
                return "spark"  # (no listing: a worker of another conftest; by folder)
            return "kafka" if path.endswith("/test_kafka_publish.py") else nodeid

    return Groups(config, log)


SQL_KINDS = ("sqlite", "postgresql", "mariadb")
"""The SQL databases a store or sink is tested on (the ``sql_url`` fixture)."""


# A passed test's tmp_path is removed once its fixtures are torn down: relays with the
# default buffer reserve 1 GiB of disk for their file (docs/relay.md), and a whole run
# kept ~60 GB of them until the next run. A failed test keeps its directory (its logs).
_PASSED_TMP = pytest.StashKey[Path]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.passed:
        path = getattr(item, "funcargs", {}).get("tmp_path")
        if isinstance(path, Path):
            item.stash[_PASSED_TMP] = path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    path = item.stash.get(_PASSED_TMP, None)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


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
