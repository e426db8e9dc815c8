"""The suite's private servers start from what scripts/setup.sh installed and fetched,
on free ports, and answer: the harnesses every other test stands on."""

from __future__ import annotations

import sqlalchemy as sa
from kazoo.client import KazooClient

from databus.javadeps import classpath
from tests.support.mariadb import MariaDB
from tests.support.postgres import PostgreSQL
from tests.support.sql import sql_engine
from tests.support.zookeeper import ZooKeeper


def test_zookeeper_from_the_pinned_bundle_serves_kazoo(zookeeper: ZooKeeper) -> None:
    assert "zookeeper-3.9.5.jar" in classpath("zookeeper")
    zk = KazooClient(hosts=zookeeper.hosts, timeout=10)
    zk.start(timeout=15)
    try:
        zk.create("/databus/harness", b"hello", makepath=True)
        assert zk.get("/databus/harness")[0] == b"hello"
    finally:
        zk.stop()
        zk.close()
    assert "Mode: standalone" in zookeeper.four_letter("srvr")


def test_postgres_is_private_logical_and_gives_fresh_databases(postgres: PostgreSQL) -> None:
    assert postgres.port != 5432
    with postgres.fresh_database() as url, sql_engine(url) as engine, engine.connect() as conn:
        assert conn.execute(sa.text("SHOW wal_level")).scalar() == "logical"
        conn.execute(sa.text("CREATE TABLE t (id int primary key)"))


def test_mariadb_is_private_with_binlog(mariadb: MariaDB) -> None:
    assert mariadb.port != 3306
    with mariadb.connect() as con, con.cursor() as cur:
        cur.execute("SELECT @@log_bin, @@binlog_format")
        assert cur.fetchone() == (1, "ROW")
