"""A static client cluster's config: ``partitions``/``member`` become this member's MOD
bucket of every source, and impossible combinations are refused at once."""

from __future__ import annotations

import pytest

from databus.client import ClientConfig
from databus.core.errors import ConfigError
from databus.core.filters import ServerFilter


def test_a_member_reads_its_bucket_of_every_source() -> None:
    cfg = ClientConfig(relay="http://r:1", sources=["main.a", "main.b"],
                       partitions="MOD:3", member=1)
    f = ServerFilter.parse(cfg.filter_for([4, 7]) or "")
    assert set(f.by_source) == {4, 7}
    assert [k for k in range(12) if f.matches(4, k)] == [1, 4, 7, 10]
    assert ClientConfig(relay="http://r:1").filter_for([4]) is None


@pytest.mark.parametrize(("kw", "message"), [
    ({"partitions": "MOD:3"}, "partitions and member go together"),
    ({"partitions": "MOD:3", "member": 3}, "below the 3 partitions"),
    ({"partitions": "RANGE:3", "member": 0}, "partitions"),
    ({"partitions": "MOD:3", "member": 0, "sources": []}, "need sources named"),
    ({"partitions": "MOD:3", "member": 0, "filter": {"1": {"partitionType": "MOD",
      "filters": [{"numBuckets": 2, "bktRange": {"start": 0, "end": 1}}]}}},
     "either filter or partitions"),
])
def test_impossible_partitions_are_refused(kw: dict[str, object], message: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=message):
        ClientConfig(relay="http://r:1", **{"sources": ["main.a"], **kw})
