"""databus.serving.direct.query_params: Starlette's QueryParams of the same bytes,
for every query (the direct route parses the query with it)."""

from __future__ import annotations

from urllib.parse import quote_plus

from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.datastructures import QueryParams

from databus.client.relay import stream_query
from databus.core.checkpoint import Checkpoint
from databus.serving.direct import query_params

# the pieces a query is made of, the tricky ones many times over
_PIECES = st.sampled_from([
    "&", "=", "+", "%", "%2", "%22", "%3A", "%3a", "%2C", "%7B", "%7D", "%7b", "%20", "%25",
    "%E2%82%AC", "%C3", "%zz", "a", "B", "0", "9", "{", '"', ":", ",", "-", "é", "\x00", " ",
])


@settings(max_examples=3000)
@given(st.lists(_PIECES, max_size=30).map("".join))
def test_the_same_pairs_as_starlette_for_queries_of_tricky_pieces(text: str) -> None:
    raw = text.encode("utf-8")
    assert query_params(raw).multi_items() == QueryParams(raw).multi_items()


@settings(max_examples=1000)
@given(st.binary(max_size=60))
def test_the_same_pairs_as_starlette_for_any_bytes(raw: bytes) -> None:
    assert query_params(raw).multi_items() == QueryParams(raw).multi_items()


@settings(max_examples=500)
@given(scn=st.integers(0, (1 << 63) - 1), prev=st.integers(-1, 1 << 40),
       value=st.text(max_size=20))
def test_the_same_pairs_for_client_queries(scn: int, prev: int, value: str) -> None:
    cp = Checkpoint(window_scn=scn, prev_scn=prev)
    for cp_ in (cp, cp.within(scn, 3)):
        raw = (stream_query(cp_, [1, 2], filter_json=value or None) + "&x=" + quote_plus(value))
        assert query_params(raw.encode()).multi_items() == QueryParams(raw).multi_items()
        assert query_params(raw.encode())["checkPoint"] == cp_.to_compact_json()
