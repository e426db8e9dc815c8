"""The MySQL source's cached metadata part of rows events equals the one built whole."""

from __future__ import annotations

import pytest

from databus.sources.mysql import fastpath
from databus.sources.mysql.tables import RowsMeta, _join_meta, meta_middle


def test_rows_meta_equals_meta_middle_as_transactions_files_and_servers_change() -> None:
    rows_meta = RowsMeta()
    calls = [
        (None, "", 4, 0),  # before any GTID: the first call builds, whatever it holds
        ("0-1-5", "bin.000001", 400, 1),
        ("0-1-5", "bin.000001", 2**31 + 7, 1),  # a position past 2 GiB
        ("0-1-6", "bin.000001", 900, 1),
        ("".join(["0-1-", "6"]), "bin.000001", 950, 1),  # equal, another object
        ("0-1-6", "bin.000002", 120, 1),  # rotated
        ("0-2-7", "bin.000002", 300, 2),  # another server
        ("0-2-7", "bin.000002", 310, 3),
        (None, "bin.000002", 320, 3),
    ]
    for gtid, file, pos, server_id in calls:
        assert rows_meta(gtid, file, pos, server_id) == meta_middle(gtid, file, pos, gtid,
                                                                    server_id)


def test_the_c_join_equals_the_python_one() -> None:
    join = fastpath.rows_meta()
    if join is None:
        pytest.skip("the C extension is not built")
    for pos in (0, 1, 63, 64, 127, 128, 300, 2**31, 2**32 - 1, 2**40, 2**62):
        for head, tail in ((b"", b""), (b"\x02\x0a0-1-5", b"\x02\x02")):
            assert join(head, pos, tail) == _join_meta(head, pos, tail)
