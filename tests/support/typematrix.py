"""The MySQL/MariaDB type matrix of the codec tests: every column type with the rows that
exercise it (COLUMNS, ROWS) and the extra tables (EXTRA); :func:`matrix_relay`, a relay
capturing a table of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from databus.relay.config import parse_config
from databus.relay.relay import Relay
from tests.support.mariadb import MariaDB
from tests.support.wait import wait_until

COLUMNS = [
    ("id", "INT NOT NULL PRIMARY KEY"),
    ("ti", "TINYINT"), ("tu", "TINYINT UNSIGNED"), ("si", "SMALLINT"),
    ("su", "SMALLINT UNSIGNED"), ("mi", "MEDIUMINT"), ("mu", "MEDIUMINT UNSIGNED"),
    ("i", "INT"), ("iu", "INT UNSIGNED"), ("bi", "BIGINT"), ("bu", "BIGINT UNSIGNED"),
    ("d1", "DECIMAL(65,30)"), ("d2", "DECIMAL(10,2)"), ("d3", "DECIMAL(5,0)"),
    ("f", "FLOAT"), ("db", "DOUBLE"), ("b1", "BIT(1)"), ("b9", "BIT(9)"), ("b64", "BIT(64)"),
    ("dt", "DATE"), ("t0", "TIME"), ("t3", "TIME(3)"), ("t6", "TIME(6)"), ("t1", "TIME(1)"),
    ("dtt0", "DATETIME"), ("dtt6", "DATETIME(6)"), ("dtt2", "DATETIME(2)"),
    ("ts0", "TIMESTAMP NULL"), ("ts6", "TIMESTAMP(6) NULL"), ("y", "YEAR"),
    ("c", "CHAR(10) CHARACTER SET utf8mb4"), ("vc", "VARCHAR(300) CHARACTER SET utf8mb4"),
    ("vl", "VARCHAR(20) CHARACTER SET latin1"), ("vb", "VARBINARY(20)"), ("bn", "BINARY(4)"),
    ("tx", "TEXT CHARACTER SET utf8mb4"), ("bl", "BLOB"), ("lt", "LONGTEXT"),
    ("e", "ENUM('a','b','ç')"), ("st", "SET('x','y','z')"), ("j", "JSON"),
]


ROWS = [
    (1, -128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295,
     -9223372036854775808, 18446744073709551615,
     "-12345678901234567890123456789012345.123456789012345678901234567890", "-0.01", "99999",
     1.5, -1.7976931348623157e308, 1, 300, 18446744073709551615, "1000-01-01", "-838:59:59",
     "-00:00:01.500", "838:59:58.999999", "-12:34:56.7", "1000-01-01 00:00:00",
     "9999-12-31 23:59:59.999999", "2020-02-29 12:00:00.01", "1970-01-01 00:00:01",
     "2038-01-19 03:14:07.999999", 1901, "ab", "日本語😀" * 50, "café", b"\x00\x01",
     b"ab", "emoji 😀", b"\x00\xff" * 100, "x" * 70000, "ç", "x,z", '{"k": [1, 2.5, "é"]}'),
    (2, 127, 0, 32767, 0, 8388607, 0, 2147483647, 0, 9223372036854775807, 0,
     "0.000000000000000000000000000001", "12345678.90", "-1", 3.14, 0.1, 0, 511, 0,
     "9999-12-31", "00:00:00", "00:00:00.001", "-838:59:58.999999", "838:59:58.9",
     "2000-01-01 00:00:00", "1000-01-01 00:00:00.000001", "2000-01-01 00:00:00.99",
     None, None, 2155, "", "", "", b"", b"\x00\x00\x00\x00", "", b"", "", "a", "", "null"),
    (3, *[None] * (len(COLUMNS) - 1)),
]


EXTRA = [  # zero dates, GEOMETRY, generated columns, a composite key with text
    ("k1", "INT NOT NULL"), ("k2", "VARCHAR(20) CHARACTER SET utf8mb4 NOT NULL"),
    ("dz", "DATE"), ("dtz", "DATETIME(3)"), ("g", "GEOMETRY"), ("n", "INT"),
    ("gv", "INT AS (n * 2) VIRTUAL"), ("gs", "INT AS (n + 1) STORED"),
]


@contextmanager
def matrix_relay(mariadb: MariaDB, tmp: Path, prefix: str) -> Iterator[tuple[Relay, str, Any]]:
    """A database of its own on ``mariadb`` holding table ``tm`` of :data:`COLUMNS`, a
    relay capturing it (started before any row: no snapshot) and :data:`ROWS` inserted:
    yields the relay, the table's name and a cursor (autocommit) for more changes. The
    database is dropped at exit."""
    name = f"{prefix}_{abs(hash(tmp)) % 10**8}"
    cols = ", ".join(f"`{c}` {t}" for c, t in COLUMNS)
    mariadb.execute(f"CREATE DATABASE {name}", f"CREATE TABLE {name}.tm ({cols})")
    cfg = parse_config({"source": {"url": f"{mariadb.url}/", "tables": [rf"{name}\.tm"],
                                   "snapshot_mode": "no_data"},
                        "http": {"port": 0}, "state_dir": str(tmp / "state")})
    con = mariadb.connect(name)
    con.autocommit(True)
    try:
        with Relay(cfg) as relay:
            wait_until(lambda: mariadb.binlog_dumps() > 0, 60, "the relay's binlog dump")
            cur = con.cursor()
            marks = ", ".join(["%s"] * len(COLUMNS))
            for row in ROWS:
                cur.execute(f"INSERT INTO tm VALUES ({marks})", row)
            yield relay, f"{name}.tm", cur
    finally:
        con.close()
        mariadb.execute(f"DROP DATABASE {name}")
