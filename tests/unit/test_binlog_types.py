"""Value encodings of the binlog types, against MySQL's documented bytes."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from databus.binlog import types as bt
from databus.binlog import values
from databus.binlog.rowevents import row_image
from databus.core.errors import SchemaError


def test_decimal_binary_matches_mysql_decimal2bin() -> None:
    # the example of MySQL's strings/decimal.cc (DECIMAL(14,4))
    d = decimal.Decimal
    assert values.decimal_bin(d("1234567890.1234"), 14, 4).hex() == "810dfb38d204d2"
    assert values.decimal_bin(d("-1234567890.1234"), 14, 4).hex() == "7ef204c72dfb2d"
    assert values.decimal_bin(d("0"), 10, 2) == bytes.fromhex("8000000000")
    with pytest.raises(ValueError):
        values.decimal_bin(d("0.125"), 10, 2)
    with pytest.raises(ValueError):
        values.decimal_bin(d("123456789"), 10, 2)


def test_temporal_encodings() -> None:
    v = dt.datetime(2024, 1, 2, 3, 4, 5, 123456)
    packed = int.from_bytes(values.datetime2(v, 6)[:5], "big") - 0x8000000000
    assert (packed >> 22) == 2024 * 13 + 1 and values.datetime2(v, 6)[5:] == (123456).to_bytes(3, "big")
    assert values.date3(dt.date(2024, 2, 3)) == (3 | 2 << 5 | 2024 << 9).to_bytes(3, "little")
    assert values.time2(0, 0) == bytes.fromhex("800000")
    assert values.time2((1 * 3600 + 2 * 60 + 3) * 1_000_000, 0) == (0x800000 + (1 << 12 | 2 << 6 | 3)).to_bytes(3, "big")
    with pytest.raises(ValueError):
        values.datetime2(v, 0)  # a fraction the column cannot hold


@pytest.mark.parametrize(("decl", "definition"), [
    ("INTEGER", "BIGINT"), ("BOOLEAN", "TINYINT(1)"), ("REAL", "DOUBLE"),
    ("VARCHAR(20)", "VARCHAR(20) CHARACTER SET utf8mb4"), ("TEXT", "LONGTEXT CHARACTER SET utf8mb4"),
    ("BLOB", "LONGBLOB"), ("", "LONGBLOB"), ("DECIMAL(10,2)", "DECIMAL(10,2)"),
    ("NUMERIC", "DECIMAL(65,30)"), ("DATE", "DATE"), ("DATETIME", "DATETIME(6)"),
    ("TIME(3)", "TIME(3)"), ("JSON", "LONGTEXT CHARACTER SET utf8mb4"),
])
def test_sqlite_declared_types_map_as_documented(decl: str, definition: str) -> None:
    branches = ["null", "long", "double", "string", "bytes"]
    assert bt.map_column("c", branches, decl, sqlite=True).definition == definition


def test_values_of_another_storage_class_convert_only_when_exact() -> None:
    branches = ["null", "long", "double", "string", "bytes"]
    big = bt.map_column("c", branches, "INTEGER", sqlite=True)
    assert big.encode(3.0) == (3).to_bytes(8, "little", signed=True)
    assert big.encode("42") == (42).to_bytes(8, "little", signed=True)
    cols = [big]
    with pytest.raises(SchemaError, match="column 'c'"):
        row_image(cols, ["abc"], "main.t")
    vc = bt.map_column("v", branches, "VARCHAR(3)", sqlite=True)
    assert vc.encode("\u00e9\u00e9\u00e9") == b"\x06" + "\u00e9\u00e9\u00e9".encode()
    with pytest.raises(ValueError):
        vc.encode("abcd")
    blob = bt.map_column("b", branches, "", sqlite=True)
    assert blob.encode(5) == b"\x01\x00\x00\x005"
