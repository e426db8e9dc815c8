"""``databus relay`` options without a config file (``databus.cli.relay.relay_config``)."""

from __future__ import annotations

from databus.cli.relay import relay_config
from databus.sources.config import PostgresSourceConfig


def test_relay_command_line_takes_postgresql_slot_and_publication() -> None:
    config = relay_config(None, {"source": "postgresql://u@db.example:6543/shop",
                                 "tables": r"public\..*", "port": 1, "slot": "s1",
                                 "publication": "p1", "create_publication": True})
    assert isinstance(config.source, PostgresSourceConfig)
    assert (config.source.slot, config.source.publication,
            config.source.create_publication) == ("s1", "p1", True)
