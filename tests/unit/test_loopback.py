"""databus.serving.loopback: the one "is this host loopback?" rule, over the forms a
bind address and a ``Host`` header take (issue 31: the token rule and the Host check
used two rules that disagreed on 127.0.0.5)."""

from __future__ import annotations

import pytest

from databus.serving.loopback import host_name, is_loopback


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True),
    ("127.0.0.5", True),  # Linux routes all of 127.0.0.0/8 to lo
    ("127.255.255.254", True),
    ("::1", True),
    ("[::1]", True),
    ("0:0:0:0:0:0:0:1", True),
    ("::ffff:127.0.0.5", True),  # IPv4-mapped
    ("localhost", True),
    ("LocalHost", True),  # names are case-insensitive
    ("localhost.", True),
    ("10.0.0.1", False),
    ("128.0.0.1", False),
    ("126.255.255.255", False),
    ("0.0.0.0", False),  # the wildcard: every address, not loopback
    ("::", False),
    ("::ffff:10.0.0.1", False),
    ("example.com", False),
    ("foo.localhost", False),  # its address is up to the resolver
    ("localhost.example.com", False),
    ("127.0.0.1.example.com", False),
    ("", False),
    ("[]", False),
    ("[127.0.0.1]", False),  # brackets hold IPv6 only
])
def test_a_bind_address_is_loopback_by_one_rule(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(("header", "name"), [
    ("127.0.0.1", "127.0.0.1"),
    ("127.0.0.5:8080", "127.0.0.5"),
    ("[::1]:80", "::1"),
    ("[::1]", "::1"),
    ("[::1]:", "::1"),  # an empty port is allowed (RFC 3986)
    ("::1", "::1"),  # unbracketed IPv6: no port can follow
    ("localhost", "localhost"),
    ("localhost:1", "localhost"),
    ("10.0.0.1", "10.0.0.1"),
    ("example.com:443", "example.com"),
    ("", ""),
    ("localhost:http", ""),  # not a port: names no host
    ("localhost:1:2", "localhost:1:2"),  # read as IPv6, which it is not
    ("[::1", ""),
    ("[::1]80", ""),
    ("[::1]:8o", ""),
    ("[127.0.0.1]:80", ""),
    ("127.0.0.1:٣", ""),  # a digit, but not an ASCII one
])
def test_the_host_a_host_header_names(header: str, name: str) -> None:
    assert host_name(header) == name


@pytest.mark.parametrize(("header", "loopback"), [
    ("127.0.0.1", True),
    ("127.0.0.5:8080", True),
    ("[::1]:80", True),
    ("::1", True),
    ("localhost", True),
    ("localhost:1", True),
    ("LOCALHOST:8080", True),
    ("10.0.0.1", False),
    ("10.0.0.1:80", False),
    ("example.com", False),
    ("example.com:8080", False),
    ("127.0.0.1.nip.io:80", False),  # a rebinding name that resolves to loopback
    ("localhost.example.com", False),
    ("", False),  # no Host at all (HTTP/1.0)
    ("localhost:1:2", False),
    ("localhost:http", False),
    ("[127.0.0.1]:80", False),  # brackets hold IPv6 only
])
def test_a_host_header_is_loopback_by_the_same_rule(header: str, loopback: bool) -> None:
    assert is_loopback(host_name(header)) is loopback
