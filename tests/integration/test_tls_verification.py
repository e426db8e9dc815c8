"""A relay whose certificate does not verify is a terminal error naming the remedy,
never retried as "unreachable" (the client library, and ``databus tail``)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from databus.client import ClientConfig, DatabusClient
from databus.client.consumer import Consumer
from databus.core.errors import TlsVerificationError
from tests.support.procs import DATABUS
from tests.support.relays import make_relay
from tests.support.shop import create_shop
from tests.support.tls import make_certs


def test_a_certificate_that_does_not_verify_is_terminal_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABUS_CA_FILE", raising=False)
    certs = make_certs(tmp_path / "certs")
    db = tmp_path / "shop.db"
    create_shop(db)
    tls = {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}
    with make_relay(db, tmp_path, http={"tls": tls}) as relay:
        # retried forever if it were "unreachable": relay_max_retries None
        cfg = ClientConfig(relay={"url": relay.url, "ca_file": certs.other_ca},
                           relay_max_retries=None, backoff_initial=0.01)
        t0 = time.monotonic()
        with pytest.raises(TlsVerificationError, match=r"CERTIFICATE_VERIFY_FAILED.*ca_file"):
            DatabusClient(cfg, Consumer()).run()
        assert time.monotonic() - t0 < 10
        done = subprocess.run(
            [*DATABUS, "tail", "--relay", relay.url, "--ca-file", str(certs.other_ca),
             "--max-windows", "1"], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("databus: TlsVerification:"), done.stderr
        assert "--ca-file" in done.stderr and "unreachable" not in done.stderr
        # the right CA: the same command reads
        with sqlite3.connect(db) as con:
            con.execute("INSERT INTO orders (id, customer_id, tx) VALUES (1, 1, 0)")
        ok = subprocess.run(
            [*DATABUS, "tail", "--relay", relay.url, "--ca-file", str(certs.ca),
             "--from-start", "--max-windows", "1"], capture_output=True, text=True,
            timeout=120, check=False)
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout.splitlines()[0])["after"]["id"] == 1
