"""The client address behind a request: X-Forwarded-For believed exactly as far as configured."""

from __future__ import annotations

import pytest

from durable.clientip import client_ip, parse_address, parse_forwarded_entry


@pytest.mark.parametrize(
    ("remote", "forwarded", "trusted", "client"),
    [
        # no proxy trusted: the header is ignored, whatever it says
        ("192.0.2.10", "203.0.113.9", 0, "192.0.2.10"),
        ("2001:db8::7", None, 0, "2001:db8::7"),
        # one proxy: the address it appended (the last one) is the client
        ("10.0.0.2", "203.0.113.9", 1, "203.0.113.9"),
        # the client forged entries on the left: not believed
        ("10.0.0.2", "1.1.1.1, 6.6.6.6, 203.0.113.9", 1, "203.0.113.9"),
        # two proxies: the second from the right
        ("10.0.0.3", "203.0.113.9, 10.0.0.2", 2, "203.0.113.9"),
        ("10.0.0.3", "8.8.8.8,203.0.113.9,10.0.0.2", 2, "203.0.113.9"),
        # fewer entries than proxies: the request skipped a proxy; the peer it is
        ("203.0.113.50", "203.0.113.9", 2, "203.0.113.50"),
        ("10.0.0.2", "", 1, "10.0.0.2"),
        ("10.0.0.2", None, 1, "10.0.0.2"),
        # ports and brackets added by proxies
        ("10.0.0.2", "203.0.113.9:51234", 1, "203.0.113.9"),
        ("10.0.0.2", "[2001:db8::1]:443", 1, "2001:db8::1"),
        ("10.0.0.2", "[2001:db8::1]", 1, "2001:db8::1"),
        # IPv4-mapped IPv6 is stored as IPv4
        ("::ffff:192.0.2.1", None, 0, "192.0.2.1"),
        ("10.0.0.2", "::ffff:203.0.113.9", 1, "203.0.113.9"),
        # garbage where the client should be: the peer
        ("10.0.0.2", "not-an-ip", 1, "10.0.0.2"),
        ("10.0.0.2", "<script>", 1, "10.0.0.2"),
        # no usable peer either
        ("", None, 0, None),
        (None, "203.0.113.9", 0, None),
    ],
)  # fmt: skip
def test_client_ip(remote, forwarded, trusted, client):
    assert client_ip(remote, forwarded, trusted) == client


def test_client_ip__huge_header_keeps_its_right_end():
    forged = ", ".join(["6.6.6.6"] * 5000)
    assert client_ip("10.0.0.2", f"{forged}, 203.0.113.9", 1) == "203.0.113.9"


@pytest.mark.parametrize(
    ("entry", "address"),
    [(" 203.0.113.9 ", "203.0.113.9"), ('"[2001:db8::2]:80"', "2001:db8::2"),
     ("fe80::1%eth0", "fe80::1"), ("999.1.1.1", None), ("", None)],
)  # fmt: skip
def test_parse_forwarded_entry(entry, address):
    assert parse_forwarded_entry(entry) == address


@pytest.mark.parametrize(
    ("value", "address"),
    [
        ("192.0.2.1", "192.0.2.1"),
        ("[2001:db8::1]", "2001:db8::1"),
        ("::ffff:192.0.2.1", "192.0.2.1"),  # IPv4-mapped: stored as the IPv4
        ("fe80::1%eth0", "fe80::1"),  # the zone id is dropped
        ("x" * 100, None),  # longer than any address
        ("", None),
        (None, None),
        (1234, None),
    ],
)
def test_parse_address(value, address):
    parsed = parse_address(value)
    assert (str(parsed) if parsed is not None else None) == address
