"""Credentials a test makes itself: certificates (trustme: a CA, a server certificate
for 127.0.0.1/localhost and a client certificate, written as PEM files) and tokens
(``databus token add``, the operator's command)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import trustme

from tests.support.procs import DATABUS


@dataclass(frozen=True)
class Certs:
    ca: Path  # the CA that signed both certificates below
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: verifying against it must fail


def make_certs(directory: Path) -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("databus-client@example.test")
    paths = Certs(*(directory / n for n in (
        "ca.pem", "server.pem", "server.key", "client.pem", "client.key", "other-ca.pem")))
    ca.cert_pem.write_to_path(str(paths.ca))
    server.cert_chain_pems[0].write_to_path(str(paths.server_cert))
    for pem in server.cert_chain_pems[1:]:
        pem.write_to_path(str(paths.server_cert), append=True)
    server.private_key_pem.write_to_path(str(paths.server_key))
    client.cert_chain_pems[0].write_to_path(str(paths.client_cert))
    client.private_key_pem.write_to_path(str(paths.client_key))
    other.cert_pem.write_to_path(str(paths.other_ca))
    return paths


def add_token(file: Path, name: str, *extra: str) -> str:
    """``databus token add NAME --file FILE EXTRA...``: the new token, printed once
    (the file gets only its hash)."""
    done = subprocess.run([*DATABUS, "token", "add", name, "--file", str(file), *extra],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert token.startswith(f"{name}.") and token not in file.read_text()
    return token
