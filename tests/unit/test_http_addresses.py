"""Pure SSRF decisions, provider settings and gate decisions."""

import random
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured

from durable.http.addresses import KINDS, address_refusal, is_allowed_host, normalize_host
from durable.http.config import build
from durable.http.gates import decide

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("address", "kind", "form"),
    [
        ("127.0.0.1", "loopback", ""),
        ("127.1.2.3", "loopback", ""),
        ("::1", "loopback", ""),
        ("10.0.0.1", "private", ""),
        ("172.16.5.4", "private", ""),
        ("172.31.255.255", "private", ""),
        ("192.168.1.1", "private", ""),
        ("100.64.0.1", "private", ""),  # carrier-grade NAT
        ("169.254.169.254", "link-local", ""),  # cloud metadata service
        ("169.254.0.1", "link-local", ""),
        ("fe80::1", "link-local", ""),
        ("fd00::1", "unique-local", ""),
        ("fc12:3456::1", "unique-local", ""),
        ("fec0::1", "private", ""),  # deprecated site-local; Python calls it global
        ("224.0.0.1", "multicast", ""),  # Python calls IPv4 multicast global
        ("239.255.255.250", "multicast", ""),
        ("ff02::1", "multicast", ""),
        ("240.0.0.1", "reserved", ""),
        ("255.255.255.255", "reserved", ""),
        ("192.0.2.10", "reserved", ""),  # documentation
        ("198.18.0.1", "reserved", ""),  # benchmarking
        ("2001:db8::1", "reserved", ""),  # documentation
        ("0.0.0.0", "unspecified", ""),  # noqa: S104 - refused, not bound
        ("0.1.2.3", "unspecified", ""),  # "this network"
        ("::", "unspecified", ""),
        ("::ffff:127.0.0.1", "loopback", "IPv4-mapped"),
        ("::ffff:10.1.2.3", "private", "IPv4-mapped"),
        ("::ffff:169.254.169.254", "link-local", "IPv4-mapped"),
        ("64:ff9b::7f00:1", "loopback", "NAT64"),  # 64:ff9b::127.0.0.1
        ("64:ff9b::a00:1", "private", "NAT64"),  # 64:ff9b::10.0.0.1
        ("64:ff9b::a9fe:a9fe", "link-local", "NAT64"),  # metadata via NAT64
        ("64:ff9b:1::a00:1", "private", ""),  # local-use NAT64 prefix (RFC 8215)
        ("2002:7f00:1::", "loopback", "6to4"),
        ("2002:c0a8:101::", "private", "6to4"),
        ("::7f00:1", "loopback", "IPv4-compatible"),
        ("fe80::1%eth0", "link-local", ""),  # with a zone id
        ("192.88.99.1", "reserved", ""),  # 6to4 relay anycast, deprecated (RFC 7526)
        ("3fff::1", "reserved", ""),  # documentation (RFC 9637); Python 3.11 calls it global
        ("3fff:fff:ffff::1", "reserved", ""),  # the end of 3fff::/20
        ("5f00::1", "reserved", ""),  # SRv6 SIDs (RFC 9602)
        ("4000::1", "reserved", ""),  # IETF reserved (is_reserved), outside 2000::/3
        ("e000::1", "reserved", ""),
        ("::ffff:0:7f00:1", "loopback", "IPv4-translated"),  # ::ffff:0:127.0.0.1
        ("::ffff:0:a9fe:a9fe", "link-local", "IPv4-translated"),  # metadata, translated
        ("::ffff:0:808:808", "reserved", "IPv4-translated"),  # never routed, even if public
    ],
)
def test_address_refusal__refuses_every_non_public_class(address, kind, form):
    refusal = address_refusal(address)
    assert refusal is not None
    assert (refusal.kind, refusal.form) == (kind, form)
    assert refusal.kind in KINDS


@pytest.mark.parametrize(
    "address",
    [
        "93.184.216.34",
        "8.8.8.8",
        "1.1.1.1",
        "2606:4700:4700::1111",
        "2a00:1450:4001:80b::200e",
        "::ffff:8.8.8.8",  # IPv4-mapped public address
        "64:ff9b::808:808",  # NAT64 of a public address: how v6-only hosts reach IPv4
        "2002:808:808::1",  # 6to4 of a public address
        "192.88.98.1",  # next to the 6to4 relay block
        "3fff:1000::1",  # just past 3fff::/20
        "2001:4860:4860::8888",  # a public resolver
    ],
)
def test_address_refusal__allows_public_addresses(address):
    assert address_refusal(address) is None


@pytest.mark.parametrize(
    ("host", "allow", "allowed"),
    [
        ("127.0.0.1", ["127.0.0.1"], True),
        ("localhost", ["127.0.0.1"], False),  # names are not their addresses
        ("127.0.0.1", ["localhost"], False),
        ("Hooks.Internal.", ["hooks.internal"], True),
        ("[::1]", ["::1"], True),
        ("::1", ["[0:0:0:0:0:0:0:1]"], True),
        ("10.0.0.1", ["10.0.0.0/8"], False),  # no networks: exact hosts only
        ("evil.hooks.internal", ["hooks.internal"], False),
        ("127.0.0.1", [], False),
        ("127.0.0.1", ["", "  "], False),
    ],
)
def test_is_allowed_host__table(host, allow, allowed):
    assert is_allowed_host(host, allow) is allowed


def test_normalize_host__canonical_ip_literals():
    assert normalize_host("[0:0:0:0:0:0:0:1]") == "::1"
    assert normalize_host("Example.COM.") == "example.com"


def test_config__defaults_are_bounded():
    config = build("x")
    assert 0 < config.connect_timeout <= config.total_timeout
    assert config.max_body_bytes == 1024 * 1024
    assert config.follow_redirects is False
    assert config.allow_hosts == ()


def test_config__layers_merge_and_allow_lists_add_up():
    config = build(
        "hooks",
        {"total_timeout": 10, "allow_hosts": ["a.internal"]},
        {"max_in_flight": 2, "allow_hosts": "b.internal, c.internal"},
        extra_allow=("127.0.0.1",),
    )
    assert (config.total_timeout, config.max_in_flight) == (10, 2)
    assert config.allow_hosts == ("b.internal", "c.internal", "127.0.0.1")


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"total_timout": 3}, "unknown key"),
        ({"total_timeout": 0}, "must be > 0"),
        ({"max_body_bytes": -1}, "must be > 0"),
        ({"max_in_flight": -1}, "must be >= 0"),
    ],
)
def test_config__mistakes_are_errors_not_defaults(layer, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        build("x", layer)


def gate(**kwargs):
    values = {
        "now": NOW,
        "in_flight": 0,
        "last_start": None,
        "max_in_flight": 2,
        "min_spacing_ms": 500,
        "retry_seconds": 1.0,
        "rng": random.Random(3),
    }
    values.update(kwargs)
    return decide(**values)


@pytest.mark.parametrize(
    ("kwargs", "passed"),
    [
        ({}, True),  # nothing in flight, never started
        ({"in_flight": 1}, True),
        ({"in_flight": 2}, False),  # full
        ({"in_flight": 5, "max_in_flight": 0}, True),  # 0: no limit
        ({"last_start": NOW - timedelta(milliseconds=499)}, False),  # too soon
        ({"last_start": NOW - timedelta(milliseconds=500)}, True),  # exactly S later
        ({"last_start": NOW - timedelta(seconds=1), "min_spacing_ms": 0}, True),
    ],
)
def test_gate_decision__table(kwargs, passed):
    assert gate(**kwargs).passed is passed


def test_gate_decision__spacing_retry_is_after_the_gate_opens():
    last = NOW - timedelta(milliseconds=100)
    for seed in range(50):
        result = gate(last_start=last, rng=random.Random(seed))
        opens = last + timedelta(milliseconds=500)
        assert opens <= result.retry_at <= opens + timedelta(milliseconds=250)


def test_gate_decision__full_gate_retries_jittered_around_retry_seconds():
    times = {gate(in_flight=2, rng=random.Random(seed)).retry_at for seed in range(50)}
    assert len(times) > 40
    assert all(NOW + timedelta(seconds=0.5) <= t <= NOW + timedelta(seconds=1.5) for t in times)
