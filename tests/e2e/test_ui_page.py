"""The operator's page (``GET /ui``, docs/operations.md "The page") in a real browser:
Debian's chromium, headless, driven by Playwright (``executable_path``: no browser is
downloaded). A SQLite relay, two consumers (one keeping up, one stalled in its
callback while a writer writes) and a reader whose name is markup: the page lists
them (that name as text), marks the stalled one behind with its seconds behind
growing, shows capture running and draws a chart per consumer. Screenshots are kept in
``test-artifacts/`` (tests/support/artifacts.py; their paths printed). A two-member
cluster: a member's page lists both members, the leader among them; the leader's lists its readers by kind (a
chain relay, the follower, two clients) and marks the client stalled in its callback. A chain relay whose upstream stops: its page
shows capture retrying and NOT READY. A bootstrap server's own page.

And without a browser: the page sits behind the same tokens as the API (a token in
the URL is not read)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from databus.relay.config import parse_config
from databus.relay.relay import Relay
from tests.support.artifacts import artifact
from tests.support.bootstrap import make_bootstrap
from tests.support.browser import open_page, require_browser
from tests.support.pulling import Pulling
from tests.support.relays import make_relay
from tests.support.shop import TABLES, Writer
from tests.support.tls import add_token
from tests.support.wait import wait_until
from tests.support.writers import Repeating
from tests.support.zookeeper import ZooKeeper

BEHIND_S = 5.0  # the page marks a consumer this many seconds behind (ui.html's BEHIND_S)
HOSTILE = "<b id=injected>html</b>"  # a consumer name that is markup


def test_the_page_shows_both_consumers_marks_the_stalled_one_and_capture_running(
        shop_db: Path, tmp_path: Path) -> None:
    require_browser()
    relay = make_relay(shop_db, tmp_path)
    with relay, Writer(shop_db) as w, Pulling(relay.url, "keeps-up") as fast, \
            Pulling(relay.url, "stalled-one") as slow:
        url = relay.url
        w.transaction()
        wait_until(lambda: fast.gate.events > 0 and slow.gate.events > 0, 30,
                   "both consumers to consume the first change")
        slow.gate.open.clear()
        try:  # the source keeps changing while the page is open
            with Repeating(w.transaction, 0.5), open_page(1200, 800) as (page, script_errors):
                wait_until(slow.gate.waiting.is_set, 30, "the stalled consumer to block")
                # a consumer name is the client's to choose: the page shows it as text
                cp = json.dumps({"windowScn": -1, "windowOffset": -1})
                httpx.get(f"{url}/stream", params={"checkPoint": cp, "timeout": "0"},
                          headers={"X-Databus-Consumer": HOSTILE}, timeout=10)
                page.goto(f"{url}/ui")
                fast_row = page.locator('tr[data-consumer="keeps-up"]')
                slow_row = page.locator('tr[data-consumer="stalled-one"]')
                fast_row.wait_for(timeout=15_000)
                slow_row.wait_for(timeout=15_000)
                # the stalled one is marked once BEHIND_S behind; a refresh every 2 s
                page.locator('tr.behind[data-consumer="stalled-one"]').wait_for(
                    timeout=25_000)
                behind = float(slow_row.locator("td.seconds-behind").inner_text())
                assert behind >= BEHIND_S, behind
                assert "BEHIND" in slow_row.locator("td.name").inner_text()
                assert slow_row.locator("td.state").inner_text() == "online"
                assert slow_row.locator("td.kind").inner_text() == "client"
                # the one keeping up is not marked
                assert "behind" not in (fast_row.get_attribute("class") or "")
                assert float(fast_row.locator("td.seconds-behind").inner_text()) < BEHIND_S
                # capture and the relay itself
                assert page.locator("#capture-state").inner_text().startswith("running")
                assert page.locator("#relay-name").inner_text() == relay.stats()["name"]
                assert page.locator("#source-kind").inner_text() == "sqlite"
                assert page.locator("#ready").inner_text() == "ready"
                assert page.locator("#snapshot").inner_text().startswith("none running")
                # a chart per consumer, the stalled one's line over several refreshes
                # (waited for from here: the page's CSP forbids evaluating strings)
                line = slow_row.locator("polyline")
                wait_until(lambda: len((line.get_attribute("points") or "").split()) >= 3,
                           15, "three points on the stalled consumer's chart")
                assert page.locator("svg.chart").count() == 3
                assert page.locator("#injected").count() == 0
                assert page.get_by_text(HOSTILE).count() == 1
                # its seconds behind grow with the clock while it stays stalled
                time.sleep(2.5)
                later = float(slow_row.locator("td.seconds-behind").inner_text())
                assert later > behind + 1.0, (behind, later)
                shot = artifact("ui-page.png")
                page.screenshot(path=str(shot), full_page=True)
                print(f"screenshot of the page: {shot}")
                assert shot.stat().st_size > 1000
                assert not script_errors, script_errors
                assert page.locator("#errors").inner_text() == "none"
        finally:
            slow.gate.open.set()


def test_the_page_needs_the_same_token_as_the_api(shop_db: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    token = add_token(tokens, "ops")
    relay: Relay = make_relay(shop_db, tmp_path, http={"token_file": str(tokens)})
    with relay:
        url = relay.url
        r = httpx.get(f"{url}/ui", timeout=10)
        assert r.status_code == 401 and "Bearer" in r.headers["WWW-Authenticate"]
        # a token in the URL is not read (URLs end up in logs and browser history)
        assert httpx.get(f"{url}/ui", params={"token": token}, timeout=10).status_code == 401
        r = httpx.get(f"{url}/ui", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "connect-src 'self'" in r.headers["Content-Security-Policy"]
        assert token not in r.text and "<script>" in r.text


def test_the_page_of_a_cluster_member_lists_the_members_and_the_leader(
        shop_db: Path, tmp_path: Path, zookeeper: ZooKeeper) -> None:
    """Two members of one cluster (in this process, ZooKeeper private to the suite): the
    page of either shows the cluster section with both members, one of them the
    leader, and its own role; the leader's lists its readers by kind (a chain relay, the
    follower, two clients) and marks the client stalled in its callback while the source
    writes, not the one keeping up."""
    require_browser()
    address = f"zk://{zookeeper.hosts}/ui-{int(time.time() * 1000) % 10**9}"

    def member(name: str) -> Relay:
        return Relay(parse_config({
            "source": {"url": f"sqlite:///{shop_db}", "tables": TABLES,
                       "snapshot_mode": "no_data", "poll_interval": 0.01},
            "buffer": {"path": str(tmp_path / f"{name}.buf"), "capacity_bytes": 4 << 20,
                       "flush_interval": 0.2},
            "http": {"port": 0}, "state_dir": str(tmp_path / name),
            "cluster": {"address": address, "member_id": name}}))

    with member("m1") as m1, member("m2") as m2:
        def both_listed() -> bool:
            view = httpx.get(f"{m1.url}/admin", timeout=10).json()["cluster"].get("view")
            return bool(view) and len(view["members"]) == 2 and view["leader"] is not None
        wait_until(both_listed, 30, "both members and a leader in ZooKeeper")
        view = httpx.get(f"{m1.url}/admin", timeout=10).json()["cluster"]["view"]
        leader = m1 if view["leader"]["id"] == "m1" else m2
        chain = Relay(parse_config({  # a chain relay reading the leader
            "name": "chain-ui", "source": {"url": f"databus+{leader.url}"},
            "http": {"port": 0}, "state_dir": str(tmp_path / "chain")}))
        with chain, Writer(shop_db) as w, Pulling(leader.url, "reader-a") as a, \
                Pulling(leader.url, "reader-b") as b, open_page(1200, 700) as (page, _):
            w.transaction()
            wait_until(lambda: a.gate.events > 0 and b.gate.events > 0, 30,
                       "both readers to consume the first change")
            b.gate.open.clear()  # reader-b stalls in its callback from its next change
            with Repeating(w.transaction, 0.5):
                # the leader's page: its readers, each of a kind (the topology around it)
                page.goto(f"{leader.url}/ui")
                kinds = {"reader-a": "client", "reader-b": "client",
                         "relay chain-ui": "chain relay"}
                for name, kind in kinds.items():
                    row = page.locator(f'tr[data-consumer="{name}"]')
                    row.wait_for(timeout=15_000)
                    assert row.locator("td.kind").inner_text() == kind, name
                # the stalled reader is marked behind; the one keeping up is not
                page.locator('tr.behind[data-consumer="reader-b"]').wait_for(timeout=25_000)
                kept_up = page.locator('tr[data-consumer="reader-a"]')
                assert "behind" not in (kept_up.get_attribute("class") or "")
                follower = page.locator("#consumers tbody tr", has_text="(cluster member)")
                follower.wait_for(timeout=15_000)
                assert follower.locator("td.kind").inner_text() == "cluster follower"
                page.screenshot(path=str(artifact("ui-cluster-leader.png")), full_page=True)
                # every answer the page asked for came (the members' view used to be
                # read by two requests at once into a 500 on /consumers)
                assert page.locator("#errors").inner_text() == "none"
            b.gate.open.set()
            page.goto(f"{m2.url}/ui")
            rows = page.locator("#members tbody tr")
            rows.nth(1).wait_for(timeout=15_000)  # (no wait_for_function: the CSP)
            assert page.locator("#cluster-section").is_visible()
            assert rows.count() == 2
            texts = [rows.nth(i).inner_text() for i in range(2)]
            roles = sorted(rows.nth(i).locator("td.role").inner_text() for i in range(2))
            assert roles == ["follower", "leader"], texts
            assert any(t.startswith("m2 (this one)") for t in texts), texts
            assert {t.split()[0] for t in texts} == {"m1", "m2"}
            assert page.locator("#role").inner_text().startswith("cluster member m2")
            shot = artifact("ui-cluster-member.png")
            page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot of the page: {shot}")


def test_the_page_shows_capture_stopped(shop_db: Path, tmp_path: Path) -> None:
    """A chain relay whose upstream stops: its page turns capture from running to
    retrying with the error, readiness to NOT READY naming the capture check, the lag
    grows, and the error is listed."""
    require_browser()
    upstream = make_relay(shop_db, tmp_path)
    with upstream, Writer(shop_db) as w:
        w.transaction()
        chain = Relay(parse_config({
            "name": "chain-stops", "source": {"url": f"databus+{upstream.url}"},
            "http": {"port": 0}, "state_dir": str(tmp_path / "chain")}))
        with chain, open_page(1200, 700) as (page, _):
            page.goto(f"{chain.url}/ui")
            wait_until(lambda: page.locator("#capture-state").inner_text()
                       .startswith("running"), 20, "capture shown running")
            assert page.locator("#ready").inner_text() == "ready"
            upstream.stop()
            wait_until(lambda: page.locator("#capture-state").inner_text()
                       .startswith("retrying"), 30, "capture shown retrying")
            assert page.locator("#capture-state").get_attribute("class") == "bad"
            assert page.locator("#capture-error").inner_text() != ""
            wait_until(lambda: page.locator("#ready").inner_text()
                       .startswith("NOT READY capture"), 15, "NOT READY shown")
            wait_until(lambda: float(page.locator("#lag").inner_text().split()[0]) > 2.0,
                       15, "the lag growing")
            assert "capture" in page.locator("#errors").inner_text()
            page.screenshot(path=str(artifact("ui-capture-stopped.png")), full_page=True)


def test_the_bootstrap_servers_page_shows_producer_applier_and_lag(
        shop_db: Path, tmp_path: Path) -> None:
    """A bootstrap server reading a SQLite relay: its page shows the relay it reads (URL
    credentials blanked), the producer and applier running, the log's range, readiness,
    and the producer's lag near 0 on a chart; the relay stopped, the lag grows with the
    clock and the page says so."""
    require_browser()
    relay = make_relay(shop_db, tmp_path)
    with relay, Writer(shop_db) as w:
        bs = make_bootstrap(shop_db, tmp_path, relay)
        bs.start()
        try:
            wait_until(lambda: httpx.get(f"{bs.url}/admin", timeout=10).json()
                       ["log_start_scn"] >= 0, 30, "the initial load")
            w.transaction()
            wait_until(lambda: httpx.get(f"{bs.url}/admin", timeout=10).json()
                       ["producer"]["windows"] >= 1, 30, "the producer's first window")
            with open_page(1000, 800) as (page, script_errors):
                page.goto(f"{bs.url}/ui")
                wait_until(lambda: page.locator("#producer-state").inner_text()
                           == "running", 15, "the producer shown running")
                assert page.locator("#applier-state").inner_text() == "running"
                assert page.locator("#relay").inner_text() == relay.url
                assert page.locator("#log-range").inner_text().startswith("scn ")
                assert page.locator("#ready").inner_text() == "ready"
                wait_until(lambda: page.locator("#lag").inner_text().endswith(
                    "behind the source"), 15, "the producer's lag shown")
                assert float(page.locator("#lag").inner_text().split()[0]) < BEHIND_S
                relay.stop()  # the producer can no longer read: its lag follows the clock
                wait_until(lambda: page.locator("#producer-state").inner_text()
                           .startswith("retrying: ") and float(page.locator("#lag")
                           .inner_text().split()[0]) >= 3.0, 30,
                           "the page to show the producer retrying, behind")
                wait_until(lambda: len((page.locator("#lag-chart polyline")
                                        .get_attribute("points") or "").split()) >= 3,
                           15, "three points on the lag chart")
                shot = artifact("ui-bootstrap.png")
                page.screenshot(path=str(shot), full_page=True)
                print(f"screenshot of the page: {shot}")
                assert not script_errors, script_errors
        finally:
            bs.stop()
