"""``databus relay`` options without a config file (``config_from_args``)."""

from __future__ import annotations

from databus.relay.relay import config_from_args


def test_relay_command_line_takes_postgresql_slot_and_publication() -> None:
    config = config_from_args("postgresql://u@db.example:6543/shop", [r"public\..*"], 1, None,
                              None, source={"slot": "s1", "publication": "p1",
                                            "create_publication": True})
    assert (config.source.slot, config.source.publication,
            config.source.create_publication) == ("s1", "p1", True)
