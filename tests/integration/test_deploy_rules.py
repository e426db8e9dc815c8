"""deploy/: the Prometheus alerting rules pass ``promtool check rules`` and their unit
tests (``promtool test rules``: every alert fires on a series that should fire it and
stays quiet otherwise), and every rule's and every Grafana dashboard panel's expression
evaluates on a real Prometheus scraping a running relay (Grafana itself is not installed
here); the relay-side panels show data."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from databus.relay.relay import Relay
from tests.support.prometheus import PROMETHEUS, PROMTOOL, prometheus, query
from tests.support.shop import Writer
from tests.support.wait import wait_until

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "databus-alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "databus-alerts.test.yml"
DASHBOARD = DEPLOY / "grafana" / "databus-dashboard.json"

# panels whose every target must return data from one SQLite relay with one consumer
# (the others read MySQL/PostgreSQL-only series, evicting buffers, errors, or the
# consumer commands' own /metrics)
RELAY_PANELS = {"Capture state", "Relay lag", "Buffer span", "Events/s captured and served",
                "Buffer use", "Consumer lag", "Windows behind", "Consumers per state"}
# Grafana's built-in interval variables, as Grafana would fill them for a 1 h range
BUILTINS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}

pytestmark = pytest.mark.skipif(
    not (PROMETHEUS and PROMTOOL),
    reason="Debian's prometheus/promtool not installed (apt-get install "
           "--no-install-recommends prometheus; scripts/setup.sh with DATABUS_SETUP_SERVERS=1)")


def promtool(*args: str) -> str:
    assert PROMTOOL
    done = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60,
                          cwd=RULES.parent)
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout


def test_promtool_checks_the_rules_and_their_unit_tests_pass() -> None:
    out = promtool("check", "rules", str(RULES))
    alerts = [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"]
              for r in g["rules"]]
    assert f"SUCCESS: {len(alerts)} rules found" in out
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    tested = {a["alertname"] for t in tests for a in t["alert_rule_test"] if a["exp_alerts"]}
    quiet = {a["alertname"] for t in tests for a in t["alert_rule_test"] if not a["exp_alerts"]}
    assert set(alerts) == tested == quiet, "every alert is tested firing and quiet"
    assert "SUCCESS" in promtool("test", "rules", str(RULE_TESTS))


def panel_targets(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expression with every $-variable filled in) of every panel,
    rows' nested panels included; template variables as "All" (regex match-all)."""
    names = {v["name"] for v in dashboard["templating"]["list"] if v["type"] == "query"}
    stack = list(dashboard["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in BUILTINS.items():
                expr = expr.replace(var, value)
            for name in names:
                expr = re.sub(r"\$\{" + name + r"(:\w+)?\}|\$" + name + r"\b", ".*", expr)
            assert "$" not in expr, f"{panel['title']}: a variable left in {expr!r}"
            yield panel["title"], expr


def test_the_dashboard_is_a_grafana_dashboard_on_a_prometheus_datasource_variable() -> None:
    d = json.loads(DASHBOARD.read_text())
    assert d["schemaVersion"] >= 39 and d["uid"] and d["title"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert variables["instance"]["includeAll"] and variables["instance"]["allValue"] == ".*"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
            assert all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for t in p["targets"])
    titles = {title for title, _ in panel_targets(d)}
    assert titles >= RELAY_PANELS


def test_every_rule_and_panel_expression_evaluates_on_prometheus_scraping_a_relay(
        relay: Relay, shop_db: Path, tmp_path: Path) -> None:
    # a consumer named, so the per-consumer series exist; a few changes captured
    with Writer(shop_db, rollback_ratio=0.0) as writer:
        for _ in range(5):
            writer.transaction()
    httpx.get(f"{relay.url}/stream", timeout=10, headers={"X-Databus-Consumer": "deploy-test"},
              params={"checkPoint": '{"windowScn": -1, "windowOffset": -1}', "timeout": "0"})
    target = relay.url.removeprefix("http://")
    with prometheus(tmp_path / "prom", {"databus-relay": [target]},
                    rule_files=[RULES]) as prom:
        # two scrapes at least, so rate() over the relay's counters has data
        wait_until(lambda: query(prom, "count_over_time(databus_relay_fetcher_up[1m]) >= 3"),
                   20, "three scrapes of the relay")
        assert query(prom, f'up{{job="databus-relay", instance="{target}"}}')[0]["value"][1] == "1"

        # Prometheus loaded and evaluates every rule without error, and none fires
        groups = httpx.get(f"{prom}/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        wanted = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
        assert sorted(r["name"] for r in rules) == sorted(r["alert"] for r in wanted)
        wait_until(lambda: all(r.get("lastEvaluation", "").startswith("2")
                               for g in httpx.get(f"{prom}/api/v1/rules", timeout=10)
                               .json()["data"]["groups"] for r in g["rules"]),
                   10, "every rule evaluated once")
        for g in httpx.get(f"{prom}/api/v1/rules", timeout=10).json()["data"]["groups"]:
            for r in g["rules"]:
                assert r["health"] == "ok", f"{r['name']}: {r.get('lastError')}"
                assert r["state"] == "inactive", f"{r['name']} {r['state']} on a healthy relay"
        for r in wanted:
            query(prom, r["expr"])  # an error fails here; an empty result is fine

        # every panel's expression evaluates; the relay's panels show the relay
        empty = []
        for title, expr in panel_targets(json.loads(DASHBOARD.read_text())):
            result = query(prom, expr)
            if title in RELAY_PANELS and not result:
                empty.append((title, expr))
        assert not empty, f"relay panels without data: {empty}"
        # the template variables' label_values() find the relay and its consumer
        values = {}
        for var in json.loads(DASHBOARD.read_text())["templating"]["list"]:
            if var["type"] == "query":
                m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"])
                assert m, var["query"]
                answer = httpx.get(f"{prom}/api/v1/label/{m.group(2)}/values", timeout=10,
                                   params={"match[]": m.group(1)}).json()
                assert answer["status"] == "success", answer
                values[var["name"]] = answer["data"]
        assert values == {"instance": [target], "consumer": ["deploy-test"]}
        lag = query(prom, 'max by (consumer) (databus_relay_consumer_lag_seconds{instance=~".*"})')
        assert [s["metric"]["consumer"] for s in lag] == ["deploy-test"]
