"""Both readers' failures are caught as DatabusErrors, and a table the token may not read is
an authorization error, not a missing source.

Spark raises a reader's failure as its own exception (``AnalysisException`` or
``IllegalArgumentException`` at ``load()``, ``StreamingQueryException`` later);
``databus.spark.errors()`` raises the DatabusError it stands for, with its code.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from databus.auth import Grant, add_token, read_grants, write_grants
from databus.core.errors import (
    ConfigError,
    DatabusError,
    ForbiddenError,
    TerminalError,
    UnknownSourceError,
)
from databus.relay.relay import Relay
from databus.spark import errors, jvm
from tests.support.relays import make_relay
from tests.support.shop import Writer, create_shop
from tests.support.sparkrelay import wait_relay

pytestmark = pytest.mark.skipif(jvm.jar() is None, reason="no JDK here to build the JVM reader")

READERS = ["databus-jvm", "databus-python"]


@pytest.fixture
def closed(tmp_path: Path) -> Iterator[tuple[Relay, Path, Path]]:
    """A relay needing tokens; the token ``orders`` may read main.orders only."""
    db = tmp_path / "shop.db"
    create_shop(db)
    tokens = tmp_path / "tokens.jsonl"
    token_file = tmp_path / "orders.token"
    token_file.write_text(add_token(tokens, "orders", [r"main\.orders"]) + "\n")
    relay = make_relay(db, tmp_path, http={"token_file": str(tokens)})
    with relay, Writer(db, seed=3) as w:
        for _ in range(20):
            w.transaction()
        wait_relay(relay, db)
        yield relay, tokens, token_file


def customers_id(relay: Relay) -> int:
    return next(s.id for s in relay.source.sources() if s.name == "main.customers")


@pytest.mark.parametrize("fmt", READERS)
def test_a_table_the_token_may_not_read_is_forbidden_at_load(
        spark: SparkSession, closed: tuple[Relay, Path, Path], fmt: str) -> None:
    relay, _tokens, token_file = closed
    reader = (spark.readStream.format(fmt).option("relay", relay.url)
              .option("tokenFile", str(token_file)))
    with pytest.raises(ForbiddenError) as info, errors():
        reader.option("sources", str(customers_id(relay))).load()
    assert "refuses source" in str(info.value) and "may not read main.customers" in str(info.value)
    assert info.value.code == "Forbidden"
    # a source the relay does not have at all is still a missing one
    with pytest.raises(UnknownSourceError, match="is not served"), errors():
        reader.option("sources", "99").load()


@pytest.mark.parametrize("fmt", READERS)
def test_a_grant_withdrawn_while_a_query_runs_fails_it_as_forbidden(
        spark: SparkSession, tmp_path: Path, closed: tuple[Relay, Path, Path], fmt: str) -> None:
    relay, tokens, token_file = closed
    df = (spark.readStream.format(fmt).option("relay", relay.url).option("sources", "orders")
          .option("tokenFile", str(token_file)).option("relayRetrySeconds", "2").load()
          .select("scn", "key", "op"))

    def run() -> None:
        q = (df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
        try:
            q.awaitTermination(120)
        finally:
            q.stop()

    run()
    assert spark.read.parquet(str(tmp_path / "out")).count() > 0
    grants = read_grants(tokens)
    grants["orders"] = Grant("orders", grants["orders"].hash, (r"main\.customers",), False)
    write_grants(tokens, grants.values())
    relay.reload_tokens()
    with pytest.raises(ForbiddenError, match=r"may not read main\.orders"), errors():
        run()


@pytest.mark.parametrize("fmt", READERS)
def test_load_errors_of_both_readers_are_databus_errors_with_their_code(
        spark: SparkSession, closed: tuple[Relay, Path, Path], fmt: str) -> None:
    relay, tokens, _orders_token = closed
    # a token that may read every table of main: an unknown name is then unknown (404), not
    # withheld (a name no grant matches is Forbidden whether or not it exists)
    token_file = tokens.parent / "main.token"
    token_file.write_text(add_token(tokens, "main", [r"main\..*"]) + "\n")
    relay.reload_tokens()

    def load(**opts: str) -> None:
        reader = spark.readStream.format(fmt).option("relay", relay.url)
        for k, v in {"tokenFile": str(token_file), **opts}.items():
            reader = reader.option(k, v)
        reader.load()

    with pytest.raises(PySparkException, match="unknown option 'colour'"):  # as Spark raises it
        load(sources="orders", colour="red")
    for opts, error in (({"sources": "orders", "colour": "red"}, ConfigError),
                        ({"sources": "main.nosuch"}, UnknownSourceError),
                        ({"sources": "orders", "partitions": "0"}, ConfigError)):
        with pytest.raises(DatabusError) as info, errors():
            load(**opts)
        assert type(info.value) is error, info.value
        assert info.value.code == error.code
        assert str(info.value).startswith("databus source: ")
        assert "Traceback" not in str(info.value)  # the message, not Spark's text
        assert isinstance(info.value.__cause__, PySparkException)


def test_errors_passes_other_exceptions_unchanged() -> None:
    with pytest.raises(KeyError), errors():
        raise KeyError("x")
    text = "boom\ndatabus.core.errors.NoSuchThing: nope\nos.Whatever: x"
    with pytest.raises(RuntimeError), errors():
        raise RuntimeError(text)  # no databus error class named: left alone
    with pytest.raises(TerminalError, match=r"^it broke$"), errors():
        raise RuntimeError("Traceback (most recent call last):\n  File ...\n"
                           "databus.core.errors.TerminalError: it broke\n")
