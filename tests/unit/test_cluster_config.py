"""``cluster.leaders``: k capturers need snapshots taken by the first leader only."""

from __future__ import annotations

import pytest

from databus.core.errors import ConfigError
from databus.relay.config import parse_config


def _raw(leaders: int, mode: str) -> dict[str, object]:
    return {"source": {"url": "sqlite:///x.db", "tables": ["t"], "snapshot_mode": mode},
            "cluster": {"address": "zk://127.0.0.1:2181/shop", "leaders": leaders}}


@pytest.mark.parametrize("mode", ["initial", "no_data"])
def test_k_leaders_take_the_modes_that_snapshot_only_at_the_first_start(mode: str) -> None:
    config = parse_config(_raw(3, mode))
    assert config.cluster is not None and config.cluster.leaders == 3


@pytest.mark.parametrize("mode", ["always", "when_needed", "initial_only"])
def test_k_leaders_refuse_modes_that_snapshot_later(mode: str) -> None:
    with pytest.raises(ConfigError, match=f"leaders 2 needs source.snapshot_mode initial or"
                                          f" no_data \\(not {mode}\\)"):
        parse_config(_raw(2, mode))
    assert parse_config(_raw(1, mode)).source.snapshot_mode == mode


def test_leaders_must_be_at_least_one() -> None:
    with pytest.raises(ConfigError, match="leaders"):
        parse_config(_raw(0, "initial"))

