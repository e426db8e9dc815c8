"""The relay's identity (databus.relay.identity): how names are derived, what is named
after them, the locks and the refusal of state from before names were derived."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from databus.core.errors import ConfigError
from databus.relay.config import RelayConfig, parse_config
from databus.relay.identity import Claim, check_legacy_state, resolve
from databus.sources.base import SERVER_ID_BASE, Capturer, derived_server_id
from databus.sources.postgres.source import default_name


def config(**raw: Any) -> RelayConfig:
    source = {"url": "sqlite:///shop.db", "tables": ["orders"], **raw.pop("source", {})}
    return parse_config({"source": source, **raw})


def test_a_derived_name_is_stable_and_differs_per_buffer(tmp_path: Path) -> None:
    a = resolve(config(buffer={"path": str(tmp_path / "a.buf")}))
    again = resolve(config(buffer={"path": str(tmp_path / "a.buf")}))
    b = resolve(config(buffer={"path": str(tmp_path / "b.buf")}))
    assert a.derived and a.name == again.name and a.name.startswith("a-") and len(a.name) == 8
    assert b.name.startswith("b-") and b.name != a.name
    assert a.state_path == tmp_path / f"{a.name}.state.json"
    assert "buffer file" in a.origin and "set name:" in a.origin


def test_the_source_is_hashed_without_its_password_and_sqlite_paths_absolute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    buf = {"path": str(tmp_path / "r.buf")}
    with_pw = resolve(config(source={"url": "mysql://repl:secret@db:3306"}, buffer=buf))
    without = resolve(config(source={"url": "mysql://repl@db:3306"}, buffer=buf))
    other = resolve(config(source={"url": "mysql://repl@db2:3306"}, buffer=buf))
    assert with_pw.name == without.name != other.name
    monkeypatch.chdir(tmp_path)
    relative = resolve(config(source={"url": "sqlite:///shop.db"}, buffer=buf))
    absolute = resolve(config(source={"url": f"sqlite:///{tmp_path / 'shop.db'}"}, buffer=buf))
    assert relative.name == absolute.name


def test_a_memory_buffer_hashes_tables_and_port() -> None:
    a = resolve(config(http={"port": 11115}))
    assert a.name.startswith("relay-") and a.state_dir is None and a.state_path is None
    assert resolve(config(http={"port": 11116})).name != a.name
    assert resolve(config(source={"tables": ["items"]}, http={"port": 11115})).name != a.name


def test_a_given_name_wins_and_names_everything() -> None:
    ident = resolve(config(name="shop"))
    assert (ident.name, ident.derived, ident.shared, ident.legacy) == ("shop", False, "shop",
                                                                        None)
    assert ident.server_id == derived_server_id("shop")
    mysql = {"url": "mysql://root@db:3306", "server_id": 42}
    assert resolve(config(name="shop", source=mysql)).server_id == 42
    assert default_name(ident.capturer().shared_name) == "databus_shop"


def test_server_ids_are_stable_and_in_their_range() -> None:
    ids = {derived_server_id(f"relay-{i:06x}") for i in range(2000)}
    assert len(ids) == 2000
    assert all(SERVER_ID_BASE <= i < SERVER_ID_BASE + 10**9 for i in ids)
    assert derived_server_id("x") == derived_server_id("x")
    assert Capturer("x").replica_id(None) == derived_server_id("x")
    assert Capturer("x", server_id=7).replica_id(None) == 7
    assert Capturer("x", server_id=7).replica_id(9) == 9


def test_cluster_members_share_the_cluster_name_but_not_their_server_id(tmp_path: Path) -> None:
    cluster = {"address": "zk://127.0.0.1:2181/shop"}
    m1 = resolve(config(buffer={"path": str(tmp_path / "m1.buf")},
                        cluster={**cluster, "member_id": "m1"}))
    m2 = resolve(config(buffer={"path": str(tmp_path / "m2.buf")},
                        cluster={**cluster, "member_id": "m2"}))
    assert m1.shared == m2.shared == "shop" and m1.name != m2.name
    assert m1.server_id != m2.server_id
    # members given one name: the same shared name, still their own server ids
    n1 = resolve(config(name="orders", cluster={**cluster, "member_id": "m1"}))
    n2 = resolve(config(name="orders", cluster={**cluster, "member_id": "m2"}))
    assert n1.shared == n2.shared == "orders" and n1.server_id != n2.server_id


def test_legacy_state_is_refused_only_for_a_derived_name_without_state(tmp_path: Path) -> None:
    cfg = config(buffer={"path": str(tmp_path / "a.buf")})
    ident = resolve(cfg)
    check_legacy_state(ident)  # nothing there
    (tmp_path / "relay.mysql-schemas.json").write_text("{}")
    with pytest.raises(ConfigError, match="start it with --name relay") as err:
        check_legacy_state(ident)
    assert "relay.mysql-schemas.json" in str(err.value)
    (tmp_path / "relay.state.json").write_text(json.dumps({"max_scn": 5, "trim_scn": 3}))
    with pytest.raises(ConfigError, match=r"relay\.state\.json"):
        check_legacy_state(ident)
    check_legacy_state(resolve(config(name="relay", buffer={"path": str(tmp_path / "a.buf")})))
    check_legacy_state(resolve(config(name="mine", buffer={"path": str(tmp_path / "a.buf")})))
    # written since names exist (a relay named relay on purpose): not a legacy file
    (tmp_path / "relay.state.json").write_text(json.dumps({"name": "relay", "max_scn": 5,
                                                           "trim_scn": 3}))
    check_legacy_state(ident)
    # a relay that has state of its own is not asked
    (tmp_path / "relay.state.json").write_text(json.dumps({"max_scn": 5, "trim_scn": 3}))
    assert ident.state_path is not None
    ident.state_path.write_text("{}")
    check_legacy_state(ident)


def test_locks_refuse_a_second_relay_naming_the_first(tmp_path: Path) -> None:
    cfg = config(name="twin", buffer={"path": str(tmp_path / "a.buf")})
    first = Claim(resolve(cfg), cfg)
    first.serving_at("http://127.0.0.1:1234")
    try:
        other_buffer = config(name="twin", buffer={"path": str(tmp_path / "b.buf")})
        with pytest.raises(ConfigError) as err:
            Claim(resolve(other_buffer), other_buffer)
        text = str(err.value)
        assert text.startswith("refusing to start relay twin: its state")
        assert f"held by relay twin, pid {os.getpid()}" in text
        assert "url http://127.0.0.1:1234" in text
        same_buffer = config(name="other", buffer={"path": str(tmp_path / "a.buf")})
        with pytest.raises(ConfigError, match=r"its buffer file .* is in use by another relay"):
            Claim(resolve(same_buffer), same_buffer)
        assert not (tmp_path / "other.lock").exists(), "nothing taken by a refused start"
    finally:
        first.release()
    again = Claim(resolve(cfg), cfg)  # released: the next start takes them
    again.release()
    assert oct((tmp_path / "twin.lock").stat().st_mode & 0o777) == "0o600"


def test_a_path_that_is_not_a_buffer_is_refused_before_any_lock(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    db.write_bytes(b"SQLite format 3\0" + b"\0" * 100)
    cfg = config(buffer={"path": str(db)})
    with pytest.raises(ConfigError, match="refusing to use"):
        Claim(resolve(cfg), cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shop.db"]
