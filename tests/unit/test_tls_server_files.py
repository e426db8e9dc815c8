"""A server's TLS files: each one that cannot be used is named as what it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from databus.core.errors import ConfigError
from databus.serving import TlsServerConfig
from tests.support.tls import make_certs


def test_a_missing_key_is_reported_against_the_key_file(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    missing = tmp_path / "nope.key"
    with pytest.raises(ConfigError, match=rf"TLS private key file {missing}: No such file"):
        TlsServerConfig(cert_file=certs.server_cert, key_file=missing).server_context()


def test_a_missing_certificate_and_client_ca_are_named(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    with pytest.raises(ConfigError, match=r"TLS certificate file .*nope.pem"):
        TlsServerConfig(cert_file=tmp_path / "nope.pem",
                        key_file=certs.server_key).server_context()
    with pytest.raises(ConfigError, match=r"TLS client CA file .*nope-ca.pem"):
        TlsServerConfig(cert_file=certs.server_cert, key_file=certs.server_key,
                        client_ca_file=tmp_path / "nope-ca.pem").server_context()


def test_a_key_of_another_certificate_names_both(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    with pytest.raises(ConfigError, match=r"certificate .*server.pem and key .*client.key"
                                          r" unusable together"):
        TlsServerConfig(cert_file=certs.server_cert,
                        key_file=certs.client_key).server_context()


def test_good_files_give_a_context_that_asks_for_client_certificates(tmp_path: Path) -> None:
    import ssl

    certs = make_certs(tmp_path)
    ctx = TlsServerConfig(cert_file=certs.server_cert, key_file=certs.server_key,
                          client_ca_file=certs.ca).server_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED
