"""The consumers: ``databus tail``, ``databus replicate`` and ``databus publish``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from databus.cli.app import (
    RELAY_ACCESS_FLAGS,
    RelayOpt,
    VerboseOpt,
    app,
    consumer_metrics,
    fail,
    relay_client,
    setup_logging,
    stop_on_signals,
    with_password,
)
from databus.cli.flags import csv, settings
from databus.core.errors import DatabusError
from databus.core.redact import Redactor, url_password

SourcesOpt = Annotated[str | None, typer.Option(help="comma-separated source names or ids")]
PartitionsOpt = Annotated[str | None, typer.Option(
    help="static client cluster: MOD:N splits every source's keys into N buckets; this"
    " process reads bucket --member (needs --sources)")]
MemberOpt = Annotated[int | None, typer.Option(help="with --partitions: this member's bucket,"
                                                    " 0 to N-1")]

CLIENT_FLAGS = {**RELAY_ACCESS_FLAGS, "sources": "sources", "partitions": "partitions",
                "member": "member", "bootstrap": "bootstrap_url"}
"""Options every consumer command takes -> :class:`databus.client.ClientConfig` fields."""

TAIL_FLAGS = {**CLIENT_FLAGS, "from_start": "from_start", "checkpoint": "checkpoint_path"}
REPLICATE_FLAGS = {**CLIENT_FLAGS, "bootstrap_batch": "bootstrap_batch_size",
                   "batch_rows": "batch.rows", "batch_bytes": "batch.bytes",
                   "batch_linger": "batch.linger"}
"""``databus replicate``'s options -> :class:`databus.client.config.ReplicateConfig` fields."""


@app.command()
@relay_client
def tail(
    relay: RelayOpt,
    sources: SourcesOpt = None,
    from_start: Annotated[bool | None, typer.Option(
        "--from-start", help="start with the oldest window the relay holds")] = None,
    max_windows: Annotated[int | None, typer.Option(help="stop after this many windows")] = None,
    checkpoint: Annotated[Path | None, typer.Option(
        help="checkpoint file to resume from and keep")] = None,
    bootstrap: Annotated[str | None, typer.Option(
        help="bootstrap server URL: print the snapshot first (and use it if the relay "
        "no longer holds the checkpoint)")] = None,
    partitions: PartitionsOpt = None,
    member: MemberOpt = None,
    verbose: VerboseOpt = False,
    **options: Any,
) -> None:
    """Print every change as a JSON envelope, one per line.

    Without --from-start (and without a stored checkpoint) it starts at the
    newest window: only changes committed from now on are printed. An unreachable
    relay is given up after a few tries.
    """
    values = {**locals(), **options, "sources": csv(sources)}
    redactor = setup_logging(verbose)
    try:
        from databus.client.config import ClientConfig  # imported when run
        from databus.client.runners import TAIL_DEFAULTS
        from databus.client.runners import tail as run_tail

        cfg = ClientConfig(**{**TAIL_DEFAULTS, **settings(values, TAIL_FLAGS)})
        with consumer_metrics("tail", values) as watch:
            run_tail(cfg, sys.stdout, max_windows=max_windows, stop=stop_on_signals(),
                     watch=watch.client if watch else None)
    except DatabusError as exc:
        fail(exc, redactor)


@app.command()
@relay_client
def replicate(
    relay: RelayOpt,
    target: Annotated[str, typer.Option(help="SQLAlchemy URL of the target database")],
    sources: SourcesOpt = None,
    bootstrap: Annotated[str | None, typer.Option(
        help="bootstrap server URL: a new replica starts from its snapshot, and a replica "
        "the relay no longer holds catches up from it")] = None,
    bootstrap_batch: Annotated[int | None, typer.Option(
        help="snapshot rows / catch-up events per bootstrap request")] = None,
    batch_rows: Annotated[int | None, typer.Option(
        help="row changes per target transaction at most (whole windows; 1: a transaction"
        " per window; default 10000)")] = None,
    batch_bytes: Annotated[int | None, typer.Option(
        help="bytes of row images per target transaction at most (default 16 MiB)")] = None,
    batch_linger: Annotated[float | None, typer.Option(
        help="seconds a batch waits for more windows before it is committed (default"
        " 0.1)")] = None,
    target_password_file: Annotated[Path | None, typer.Option(
        help="file whose first line is the target's password (keeps it out of the URL"
        " and the process list); DATABUS_TARGET_PASSWORD works too")] = None,
    partitions: PartitionsOpt = None,
    member: MemberOpt = None,
    group: Annotated[str | None, typer.Option(
        help="dynamic client group zk://HOST:PORT/GROUP: the group's members share"
        " --group-partitions partitions and rebalance as they come and go (needs"
        " --sources)")] = None,
    group_partitions: Annotated[int | None, typer.Option(
        help="partitions of the group (default 8)")] = None,
    member_id: Annotated[str | None, typer.Option(
        help="this member's name in its group (default: HOST-PID)")] = None,
    verbose: VerboseOpt = False,
    **options: Any,
) -> None:
    """Apply the change stream to same-named tables of a target database.

    Whole windows are applied in batches, each in one target transaction together
    with the checkpoint of its last window (table databus_checkpoint), so a crash
    never applies a window twice or half.
    """
    values = {**locals(), **options, "sources": csv(sources)}
    redactor = setup_logging(verbose, Redactor([url_password(target)]))
    try:
        from databus.client.config import ReplicateConfig  # imported when run
        from databus.client.runners import REPLICATE_DEFAULTS
        from databus.client.runners import replicate as run_replicate

        target = with_password(target, target_password_file, "DATABUS_TARGET_PASSWORD")
        redactor.add(url_password(target))
        if group is None and (group_partitions is not None or member_id is not None):
            raise typer.BadParameter("--group-partitions and --member-id go with --group")
        cfg = ReplicateConfig(**{**REPLICATE_DEFAULTS, **settings(values, REPLICATE_FLAGS)})
        if group is not None:
            from databus.client.runners import replicate_group

            if partitions is not None or bootstrap is not None:
                raise typer.BadParameter("--group takes neither --partitions nor --bootstrap")
            if not cfg.sources:
                raise typer.BadParameter("--group needs --sources")
            with consumer_metrics("replicate", values) as watch:
                replicate_group(cfg, target, group, partitions=group_partitions or 8,
                                member_id=member_id, stop=stop_on_signals(),
                                watch=watch.group if watch else None)
            return
        with consumer_metrics("replicate", values) as watch:
            run_replicate(cfg, target, stop=stop_on_signals(), watch=watch.client if watch else None)
    except DatabusError as exc:
        fail(exc, redactor)


PUBLISH_FLAGS = {
    **RELAY_ACCESS_FLAGS, "bootstrap_servers": "bootstrap_servers",
    "topic_prefix": "topic_prefix", "name": "name", "sources": "sources",
    "offsets_topic": "offsets_topic", "tombstones": "tombstones_on_delete",
    "transaction_metadata": "transaction_metadata",
    "heartbeat_interval": "heartbeat_interval", "schemas_enable": "schemas_enable",
    "value_mode": "value_mode", "decimal_handling_mode": "decimal_handling_mode",
    "time_precision_mode": "time_precision_mode",
    "bigint_unsigned_handling_mode": "bigint_unsigned_handling_mode",
    "batch_windows": "batch_windows", "batch_linger": "batch_linger",
    "topic_partitions": "topic_partitions", "replication_factor": "topic_replication_factor",
    "create_topics": "create_topics", "kafka_config": "kafka_config",
}
"""``databus publish``'s options -> :class:`databus.kafka.config.PublishConfig` fields."""


@app.command()
@relay_client
def publish(
    relay: RelayOpt,
    bootstrap_servers: Annotated[str, typer.Option(help="Kafka brokers, HOST:PORT[,...]")],
    topic_prefix: Annotated[str, typer.Option(
        help="topics are <prefix>.<db>.<table> (Debezium's topic.prefix)")],
    name: Annotated[str | None, typer.Option(
        help="publisher name: transactional.id databus-publish-<name> and its position's"
        " key in the offsets topic (default: the topic prefix)")] = None,
    sources: SourcesOpt = None,
    offsets_topic: Annotated[str | None, typer.Option(
        help="compacted topic of the publishers' positions (default"
        " databus-publish-offsets)")] = None,
    tombstones: Annotated[bool | None, typer.Option(
        "--tombstones/--no-tombstones", help="a tombstone (null value) after each delete"
        " (default: on)")] = None,
    transaction_metadata: Annotated[bool | None, typer.Option(
        "--transaction-metadata/--no-transaction-metadata",
        help="BEGIN/END records on <prefix>.transaction (default: on)")] = None,
    heartbeat_interval: Annotated[float | None, typer.Option(
        help="seconds idle before a heartbeat on __debezium-heartbeat.<prefix> (0: none;"
        " default 10)")] = None,
    schemas_enable: Annotated[bool | None, typer.Option(
        "--schemas-enable/--no-schemas-enable",
        help="JSON with the Kafka Connect schema part (schemas.enable; default: on)")] = None,
    value_mode: Annotated[str | None, typer.Option(
        help="column values: databus (docs/json.md, the default) or debezium (as"
        " Debezium's MySQL connector)")] = None,
    decimal_handling_mode: Annotated[str | None, typer.Option(
        help="value-mode debezium: precise, string or double")] = None,
    time_precision_mode: Annotated[str | None, typer.Option(
        help="value-mode debezium: adaptive_time_microseconds or connect")] = None,
    bigint_unsigned_handling_mode: Annotated[str | None, typer.Option(
        help="value-mode debezium: long or precise")] = None,
    batch_windows: Annotated[int | None, typer.Option(
        help="whole windows per Kafka transaction at most (1: one per window)")] = None,
    batch_linger: Annotated[float | None, typer.Option(
        help="seconds a transaction waits for more windows before it commits")] = None,
    topic_partitions: Annotated[int | None, typer.Option(
        help="partitions of created data topics (-1: the broker's default)")] = None,
    replication_factor: Annotated[int | None, typer.Option(
        help="replication factor of created topics (-1: the broker's default)")] = None,
    create_topics: Annotated[bool | None, typer.Option(
        "--create-topics/--no-create-topics", help="create missing topics (default: on)")
        ] = None,
    kafka_config: Annotated[Path | None, typer.Option(
        help="librdkafka properties file (key=value: security.protocol, sasl.*, ssl.*)")] = None,
    verbose: VerboseOpt = False,
    **options: Any,
) -> None:
    """Publish the change stream into Kafka, whole windows per transaction.

    Topics, keys and values follow Debezium's (docs/kafka.md). Whole windows' messages
    and the publisher's position are committed in one Kafka transaction, so a publisher
    killed at any point resumes without loss and, for read_committed consumers,
    without duplicates.
    """
    values = {**locals(), **options, "sources": csv(sources)}
    redactor = setup_logging(verbose)
    if not verbose:  # librdkafka's connection attempts: the errors are reported as ours
        logging.getLogger("databus.kafka.librdkafka").setLevel(logging.CRITICAL)
    try:
        from databus.kafka.config import PublishConfig, read_kafka_properties

        props = read_kafka_properties(kafka_config) if kafka_config is not None else None
        if props:
            redactor.add(*(v for k, v in props.items() if "password" in k or "secret" in k))
        cfg = PublishConfig(**settings({**values, "kafka_config": props}, PUBLISH_FLAGS))
        try:
            from databus.kafka.publisher import run_publish  # imported when run
        except ImportError as exc:
            from databus.core.errors import ConfigError

            raise ConfigError("databus publish needs confluent-kafka: pip install"
                              " 'databus[kafka]'") from exc
        with consumer_metrics("publish", values) as watch:
            run_publish(cfg, stop=stop_on_signals(), watch=watch.client if watch else None)
    except DatabusError as exc:
        fail(exc, redactor)
