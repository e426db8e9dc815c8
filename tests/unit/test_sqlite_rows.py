"""SQLite column affinity -> Avro unions, row images and event keys (no database)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from databus.core.errors import SchemaError
from databus.core.schema import MetadataCodec
from databus.sources.txlog.catalog import Column, TableVersion
from databus.sources.txlog.rows import VersionCodec, WindowMetadata, affinity, avro_branches


@pytest.mark.parametrize(("decl", "aff", "first"), [
    ("INTEGER", "INTEGER", "long"), ("int", "INTEGER", "long"), ("BIGINT", "INTEGER", "long"),
    ("POINT", "INTEGER", "long"),  # "INT" anywhere wins, as in SQLite
    ("VARCHAR(20)", "TEXT", "string"), ("clob", "TEXT", "string"), ("TEXT", "TEXT", "string"),
    ("BLOB", "BLOB", "bytes"), ("", "BLOB", "bytes"),
    ("REAL", "REAL", "double"), ("FLOAT", "REAL", "double"), ("DOUBLE PRECISION", "REAL", "double"),
    ("NUMERIC", "NUMERIC", "long"), ("DECIMAL(10,2)", "NUMERIC", "long"),
    ("BOOLEAN", "NUMERIC", "long"), ("DATE", "NUMERIC", "long"), ("DATETIME", "NUMERIC", "long"),
])
def test_affinity_follows_sqlite_rules(decl: str, aff: str, first: str) -> None:
    assert affinity(decl) == aff
    branches = avro_branches(decl)
    assert branches[0] == first
    assert sorted(branches) == ["bytes", "double", "long", "string"]


def _codec(cols: list[Column], keys: tuple[str, ...]) -> VersionCodec:
    return VersionCodec(TableVersion(7, "main.t", 1, tuple(cols), keys))


def test_every_storage_class_fits_every_column_and_round_trips() -> None:
    decls = ["INTEGER", "REAL", "TEXT", "BLOB", "NUMERIC"]
    codec = _codec([Column(f"c{i}", d, False, 0, 0) for i, d in enumerate(decls)], ())
    for value in [None, 0, -(2**63), 2**63 - 1, 0.1, -0.0, 5e-324, float("inf"), "", "é😀",
                  "a\x00b", b"", b"\x00\xff"]:
        image = [value] * len(decls)
        row = codec.schema.decode(codec.encode(image))
        assert [repr(row[f"c{i}"]) for i in range(len(decls))] == [repr(value)] * len(decls)


def test_not_null_columns_have_no_null_branch() -> None:
    codec = _codec([Column("id", "INTEGER", True, 1, 0), Column("v", "TEXT", False, 0, 0)],
                   ("id",))
    types = [f["type"] for f in codec.schema.avro["fields"]]
    assert types == [["long", "double", "string", "bytes"],
                     ["null", "string", "long", "double", "bytes"]]
    assert codec.schema.avro["fields"][1]["sql_type"] == "TEXT"


def test_keys() -> None:
    single = _codec([Column("id", "INT", True, 1, 0)], ("id",))
    assert single.key([42], None) == 42
    assert single.key(["abc"], None) == b'["abc"]'  # not an integer: bytes form
    text = _codec([Column("k", "TEXT", True, 1, 0)], ("k",))
    assert text.key(["é"], None) == '["é"]'.encode()
    comp = _codec([Column("a", "TEXT", True, 2, 0), Column("b", "BLOB", True, 1, 0),
                   Column("c", "REAL", False, 0, 0)], ("b", "a"))
    key = comp.key(["x", b"\x00\x01", 0.5], None)
    assert isinstance(key, bytes) and json.loads(key) == [{"hex": "0001"}, "x"]
    rowid = _codec([Column("v", "TEXT", False, 0, 0)], ())
    assert rowid.key(["x"], 17) == 17


def test_direct_avro_is_byte_identical_to_fastavro() -> None:
    rng = random.Random(3)
    decls = ["INTEGER", "REAL", "TEXT", "BLOB", "NUMERIC", ""]
    codec = _codec([Column(f"c{i}", d, i == 0, 0, 0) for i, d in enumerate(decls)], ())
    pool: list[Any] = [None, 0, 1, -1, 63, 64, -65, 2**63 - 1, -(2**63), 0.5, -0.0,
                       float("inf"), 1e-310, "", "x" * 70, "é😀\x00", b"", b"\x00" * 200]
    for _ in range(2000):
        image = [rng.choice(pool[1:])] + [rng.choice(pool) for _ in decls[1:]]
        image[rng.randrange(len(image))] = rng.getrandbits(64) - 2**63
        assert codec.encode(image) == codec.schema.encode(codec.row(image))
    with pytest.raises(SchemaError):
        codec.encode([None, 1, 2, 3, 4, 5])  # NULL in a NOT NULL column


def test_window_metadata_matches_the_codec() -> None:
    codec = MetadataCodec()
    meta = WindowMetadata(codec, "sqlite:12345")
    for before in (None, b"", b"\x01" * 300):
        for row in (0, 63, 64, 10**6):
            data = meta.encode(before, row)
            assert data == codec.encode({"before": before, "txid": "sqlite:12345", "row": row})
            assert codec.decode(data)["row"] == row
