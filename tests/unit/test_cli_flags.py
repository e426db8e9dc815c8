"""Every command-line option is a setting of the model it configures, applied or refused.

* Every option of every command is in its command's table (:mod:`databus.cli.flags`)
  or named below as an option of the command itself (what to print, when to stop).
* Every table entry names a field of its model, and an option given alone lands there.
* ``relay`` and ``binlog-server`` take ``--config``: each of their options given with a
  config file of each kind is either applied (the built config holds its value) or
  refused (a one-line error), never dropped, and each is applied with at least one file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from pydantic import BaseModel

from databus.binlog.config import BinlogServiceConfig
from databus.cli import app
from databus.cli.consume import PUBLISH_FLAGS, REPLICATE_FLAGS, TAIL_FLAGS
from databus.cli.flags import Flags, settings
from databus.cli.relay import RELAY_FLAGS, SIGNAL_FLAGS, relay_config
from databus.cli.services import BINLOG_FLAGS, binlog_config
from databus.cli.status import STATUS_FLAGS
from databus.client.config import ClientConfig, ReplicateConfig
from databus.client.runners import REPLICATE_DEFAULTS, TAIL_DEFAULTS
from databus.core.access import RelayAccess
from databus.core.config import merged
from databus.core.errors import ConfigError
from databus.kafka.config import PublishConfig
from databus.relay.config import RelayConfig
from databus.sources.config import (
    ChainSourceConfig,
    MysqlSourceConfig,
    PostgresSourceConfig,
    SqliteSourceConfig,
)

TABLES: dict[str, Flags] = {
    "relay": RELAY_FLAGS, "binlog-server": BINLOG_FLAGS, "tail": TAIL_FLAGS,
    "replicate": REPLICATE_FLAGS, "publish": PUBLISH_FLAGS, "signal": SIGNAL_FLAGS,
    "status": STATUS_FLAGS,
}

# Options that configure the command's own run, not a component's model: why each is not
# in a table.
OWN: dict[str, set[str]] = {
    "relay": {"config", "verbose"},
    "binlog-server": {"config", "verbose"},
    # --metrics-port/--metrics-host: the process's own listener, not a client setting
    "tail": {"max_windows", "verbose", "metrics_port", "metrics_host"},  # when to stop
    "replicate": {"target", "target_password_file",      # the sink's target, not the client's
                  "group", "group_partitions", "member_id", "verbose",  # the group runner's
                  "metrics_port", "metrics_host"},
    "publish": {"verbose", "metrics_port", "metrics_host"},
    "signal": {"kind", "tables", "data"},                # the signal itself
    "status": {"as_json"},                               # how to print
    "bootstrap": {"config", "verbose"},                  # everything else is in the file
    "demo": {"transactions", "workdir", "quiet"},
    "cluster status": {"address", "as_json"},
    "token add": {"name", "file", "tables", "admin", "replace"},
    "token remove": {"name", "file"},
    "token list": {"file"},
}


def _commands() -> dict[str, Any]:
    root: Any = typer.main.get_command(app)
    out: dict[str, Any] = {}
    for name, cmd in root.commands.items():
        if hasattr(cmd, "commands"):  # a group
            out.update({f"{name} {sub}": c for sub, c in cmd.commands.items()})
        else:
            out[name] = cmd
    return out


def test_every_option_of_every_command_is_a_setting_or_the_commands_own() -> None:
    commands = _commands()
    assert set(commands) == set(OWN), "a command was added or removed: list its options"
    for name, cmd in commands.items():
        params = {p.name for p in cmd.params} - {"help"}
        table = set(TABLES.get(name, {}))
        own = OWN[name]
        assert not table & own, f"{name}: {sorted(table & own)} both in a table and own"
        assert params == table | own, (
            f"{name}: options not in its table {sorted(params - table - own)},"
            f" table entries that are no option {sorted((table | own) - params)}")
        for p in cmd.params:  # an option not given must set nothing: its default is None
            if p.name in table:
                assert p.default is None or p.required, (
                    f"{name} --{p.name}: default {p.default!r} restates the model's")


def _field(model: type[BaseModel], path: str) -> bool:
    head, _, rest = path.partition(".")
    if head == "source" and model is RelayConfig:
        kinds = (SqliteSourceConfig, MysqlSourceConfig, PostgresSourceConfig,
                 ChainSourceConfig)
        return any(_field(k, rest) for k in kinds)
    info = model.model_fields.get(head)
    if info is None:
        return False
    if not rest:
        return True
    sub = info.annotation
    for cand in getattr(sub, "__args__", (sub,)):
        if isinstance(cand, type) and issubclass(cand, BaseModel) and _field(cand, rest):
            return True
    return False


@pytest.mark.parametrize(("table", "model"), [
    (RELAY_FLAGS, RelayConfig), (BINLOG_FLAGS, BinlogServiceConfig),
    (TAIL_FLAGS, ClientConfig), (REPLICATE_FLAGS, ReplicateConfig),
    (PUBLISH_FLAGS, PublishConfig), (SIGNAL_FLAGS, RelayAccess), (STATUS_FLAGS, RelayAccess),
])
def test_every_table_entry_names_a_field_of_its_model(table: Flags,
                                                      model: type[BaseModel]) -> None:
    missing = [f"{k} -> {v}" for k, v in table.items() if not _field(model, v)]
    assert not missing


def _at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _plain(value: Any) -> Any:
    if hasattr(value, "get_secret_value"):
        return value.get_secret_value()
    return str(value) if isinstance(value, Path) else value


# a value for each option, and what the model holds when it is applied
VALUES: dict[str, tuple[Any, Any]] = {
    "name": ("r-1", "r-1"), "tables": ("a,b", ["a", "b"]),
    "snapshot_mode": ("no_data", "no_data"), "password_file": (Path("/p"), "/p"),
    "server_id": (77, 77), "slot": ("s1", "s1"), "publication": ("p1", "p1"),
    "create_publication": (True, True), "port": (12345, 12345),
    "host": ("127.0.0.2", "127.0.0.2"), "token_file": (Path("/t"), "/t"),
    "insecure": (True, True), "tls_cert": (Path("/c.pem"), "/c.pem"),
    "tls_key": (Path("/k.pem"), "/k.pem"), "tls_client_ca": (Path("/ca.pem"), "/ca.pem"),
    "buffer_path": (Path("/b.buf"), "/b.buf"), "buffer_size": (1 << 20, 1 << 20),
    "state_dir": (Path("/s"), "/s"), "cluster": ("zk://h:1/c", "zk://h:1/c"),
    "member_id": ("m1", "m1"), "advertise_url": ("http://h:2", "http://h:2"),
    "relay": ("http://h:9", "http://h:9"), "user": ("u", "u"),
    "data_dir": (Path("/d"), "/d"), "ca_file": (Path("/ca"), "/ca"),
    "cert_file": (Path("/cc"), "/cc"), "key_file": (Path("/kk"), "/kk"),
    "sources": (["shop.a"], ["shop.a"]), "partitions": ("MOD:2", "MOD:2"),
    "member": (1, 1), "bootstrap": ("http://h:3", "http://h:3"),
    "from_start": (True, True), "checkpoint": (Path("/ck"), "/ck"),
    "bootstrap_batch": (500, 500), "bootstrap_servers": ("k:9092", "k:9092"),
    "topic_prefix": ("pre", "pre"), "offsets_topic": ("offs", "offs"),
    "tombstones": (False, False), "transaction_metadata": (False, False),
    "heartbeat_interval": (3.0, 3.0), "schemas_enable": (False, False),
    "value_mode": ("debezium", "debezium"), "decimal_handling_mode": ("string", "string"),
    "time_precision_mode": ("connect", "connect"),
    "bigint_unsigned_handling_mode": ("precise", "precise"), "batch_windows": (7, 7),
    "batch_linger": (0.5, 0.5), "topic_partitions": (3, 3), "replication_factor": (2, 2),
    "create_topics": (False, False), "kafka_config": ({"linger.ms": "5"}, {"linger.ms": "5"}),
    "batch_rows": (500, 500), "batch_bytes": (1 << 20, 1 << 20),
    "metrics_port": (9464, 9464), "metrics_host": ("0.0.0.0", "0.0.0.0"),
}
# --source: a URL of the same kind as the file's source (another kind is its own case)
SOURCE_OF = {"sqlite": "sqlite:///other.db", "mysql": "mysql://u@other:3306",
             "postgresql": "postgresql://u@other:5432/db", "chain": "databus+http://other:1"}

RELAY_FILES: dict[str, dict[str, Any]] = {
    "sqlite": {"source": {"url": "sqlite:///shop.db", "tables": ["orders"]},
               "http": {"port": 11199}},
    "mysql": {"source": {"url": "mysql://root@db:3306", "tables": [r"shop\..*"]}},
    "postgresql": {"source": {"url": "postgresql://u@db:5432/shop",
                              "tables": [r"public\..*"]}},
    "chain": {"source": {"url": "databus+http://up:11115"}},
    "sqlite+tls+cluster": {
        "source": {"url": "sqlite:///shop.db"},
        "http": {"tls": {"cert_file": "/f.pem", "key_file": "/f.key"}},
        "cluster": {"address": "zk://z:2181/c"}},
}


def _write(tmp_path: Path, name: str, raw: dict[str, Any]) -> Path:
    path = tmp_path / f"{name.replace('+', '_')}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("param", sorted(RELAY_FLAGS))
def test_each_relay_option_with_a_config_file_is_applied_or_refused(
        param: str, tmp_path: Path) -> None:
    path = RELAY_FLAGS[param]
    applied = []
    for kind, raw in RELAY_FILES.items():
        given, want = ((SOURCE_OF[kind.split("+")[0]],) * 2 if param == "source"
                       else VALUES[param])
        try:
            cfg = relay_config(_write(tmp_path, kind, raw), {param: given})
        except (ConfigError, typer.BadParameter) as exc:
            assert "\n" not in str(exc)
            continue
        got = _plain(_at(cfg, path))
        assert got == want, f"--{param} with the {kind} file: {got!r}, not {want!r}"
        applied.append(kind)
    assert applied, f"--{param} was refused with every config file"


def test_a_source_option_of_another_kind_is_refused_with_its_name(tmp_path: Path) -> None:
    cfg = _write(tmp_path, "sqlite", RELAY_FILES["sqlite"])
    with pytest.raises(ConfigError, match=r"slot is a setting of PostgreSQL sources only"):
        relay_config(cfg, {"slot": "s1"})
    with pytest.raises(ConfigError, match=r"server_id is a setting of MySQL/MariaDB"):
        relay_config(cfg, {"server_id": 5})


def test_relay_options_win_over_the_file(tmp_path: Path) -> None:
    cfg = relay_config(_write(tmp_path, "sqlite", RELAY_FILES["sqlite"]),
                       {"port": 45549, "buffer_path": Path("cfg.buf")})
    assert cfg.http.port == 45549 and cfg.buffer.path == Path("cfg.buf")
    assert cfg.source.tables == ["orders"]  # what the options do not name stays the file's


BINLOG_FILE = {"relay": "http://r:11115", "password_file": "/pw", "port": 3399,
               "tls": {"cert_file": "/f.pem", "key_file": "/f.key"}}


@pytest.mark.parametrize("param", sorted(BINLOG_FLAGS))
def test_each_binlog_server_option_with_a_config_file_is_applied(
        param: str, tmp_path: Path) -> None:
    given, want = VALUES[param]
    if param == "tables":
        want = ["a", "b"]
    values = {param: given}
    if param in ("cert_file", "key_file"):  # a client certificate and its key go together
        values.update(cert_file=Path("/cc"), key_file=Path("/kk"))
    cfg = binlog_config(_write(tmp_path, "binlog", BINLOG_FILE), values)
    assert _plain(_at(cfg, BINLOG_FLAGS[param])) == want


def test_binlog_server_options_alone_need_relay_and_password(tmp_path: Path) -> None:
    with pytest.raises(typer.BadParameter, match="--relay"):
        binlog_config(None, {"port": 1})
    with pytest.raises(ConfigError, match="--password-file"):
        binlog_config(None, {"relay": "http://r:1"})


RELAY = {"relay": {"url": "http://r:1"}}


@pytest.mark.parametrize(("table", "build"), [
    (TAIL_FLAGS, lambda s: ClientConfig(**merged({**TAIL_DEFAULTS, **RELAY}, s))),
    (REPLICATE_FLAGS, lambda s: ReplicateConfig(**merged({**REPLICATE_DEFAULTS, **RELAY}, s))),
    (PUBLISH_FLAGS, lambda s: PublishConfig(**merged(
        {**RELAY, "bootstrap_servers": "k:1", "topic_prefix": "p"}, s))),
    (SIGNAL_FLAGS, lambda s: RelayAccess.model_validate({"url": "http://r:1", **s})),
], ids=["tail", "replicate", "publish", "signal"])
def test_each_consumer_option_lands_in_its_model(table: Flags, build: Any) -> None:
    for param, path in table.items():
        given, want = VALUES[param]
        values = {param: given}
        if param == "partitions":
            values["member"] = 0
        if param == "member":
            values["partitions"] = "MOD:2"
        if param in ("partitions", "member"):
            values["sources"] = ["shop.a"]
        if param in ("cert_file", "key_file"):  # a client certificate and its key go together
            values.update(cert_file=Path("/cc"), key_file=Path("/kk"))
        cfg = build(settings(values, table))
        assert _plain(_at(cfg, path)) == want, f"--{param}"
