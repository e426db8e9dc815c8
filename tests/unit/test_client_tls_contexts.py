"""TLS contexts: one per set of TLS files per process, none for http:// relays, and
never one set's context handed to a connection with another set."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest

from databus.client import credentials as cr
from databus.client.credentials import Credentials
from databus.client.relay import RelayConnection
from tests.support.tls import make_certs


def _ca_subjects(ctx: ssl.SSLContext) -> list[object]:
    return [c["subject"] for c in ctx.get_ca_certs()]


def test_the_same_files_share_one_context_and_other_files_get_their_own(
        tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    plain = Credentials(ca_file=certs.ca)
    mutual = Credentials(ca_file=certs.ca, cert_file=certs.client_cert,
                         key_file=certs.client_key)
    other = Credentials(ca_file=certs.other_ca)
    assert Credentials(token="t1", ca_file=certs.ca).ssl_context() is plain.ssl_context()
    assert mutual.ssl_context() is not plain.ssl_context()
    assert other.ssl_context() is not plain.ssl_context()
    assert _ca_subjects(other.ssl_context()) != _ca_subjects(plain.ssl_context())
    assert _ca_subjects(plain.ssl_context()) == _ca_subjects(
        ssl.create_default_context(cafile=str(certs.ca)))


def test_a_rewritten_file_gives_a_new_context(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    creds = Credentials(ca_file=certs.ca)
    first = creds.ssl_context()
    certs.ca.write_bytes(certs.other_ca.read_bytes())  # the CA file rotated in place
    st = certs.ca.stat()
    os.utime(certs.ca, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    second = creds.ssl_context()
    assert second is not first
    assert _ca_subjects(second) == _ca_subjects(
        ssl.create_default_context(cafile=str(certs.other_ca)))


def test_an_unusable_file_is_a_config_error_each_time(tmp_path: Path) -> None:
    bad = Credentials(ca_file=tmp_path / "missing.pem")
    for _ in range(2):
        with pytest.raises(Exception, match="client TLS files unusable"):
            bad.ssl_context()


def test_http_relays_build_no_context(monkeypatch: pytest.MonkeyPatch,
                                      tmp_path: Path) -> None:
    built: list[object] = []
    real = Credentials._new_ssl_context

    def counting(self: Credentials) -> ssl.SSLContext:
        built.append(self)
        return real(self)

    monkeypatch.setattr(Credentials, "_new_ssl_context", counting)
    monkeypatch.setattr(cr, "_TLS", {})
    creds = Credentials()
    for url in ("http://127.0.0.1:1", "http://127.0.0.1:1,http://127.0.0.1:2"):
        RelayConnection(url, credentials=creds).close()
    assert built == []
    conns = [RelayConnection(u, credentials=creds) for u in
             ("https://127.0.0.1:1", "http://127.0.0.1:1,https://127.0.0.1:2",
              "https://127.0.0.1:3")]
    for c in conns:
        c.close()
    assert built == [creds]  # the three https connections share one context


def test_the_no_tls_context_verifies_and_trusts_nothing() -> None:
    ctx = cr.no_tls_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.get_ca_certs() == []
    assert cr.no_tls_context() is ctx
