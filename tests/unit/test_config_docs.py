"""docs/relay.md's config table is the models' (``tests.support.configdoc``)."""

from __future__ import annotations

from tests.support.configdoc import documented, relay_table


def test_relay_config_table_in_the_docs_is_generated_from_the_models() -> None:
    assert documented() == relay_table(), (
        "docs/relay.md's config table differs from the models: run"
        " .venv/bin/python -m tests.support.configdoc --write")


def test_every_relay_setting_has_a_description() -> None:
    cells = [[c.strip() for c in line.strip().strip("|").split("|")]
             for line in relay_table().splitlines()[2:]]
    missing = [row[0] for row in cells if not row[-1]]
    assert not missing
