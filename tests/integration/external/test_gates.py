"""Provider gates on the real database, in this process (4 workers: test_deliveries_crash)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from durable.http import gates
from durable.http.config import build
from durable.http.errors import GateClosed
from durable.http.models import GateSlot, ProviderGate

from ..servers import Reply, max_concurrency

pytestmark = pytest.mark.django_db


def test_in_flight_gate__turns_the_k_plus_first_away_without_spending_an_attempt():
    config = build("g", {"max_in_flight": 2})
    first = gates.acquire(config, holder="a")
    second = gates.acquire(config, holder="b")
    with pytest.raises(GateClosed) as info:
        gates.acquire(config, holder="c")
    assert info.value.consume_attempt is False
    assert timezone.now() < info.value.at <= timezone.now() + timedelta(seconds=1.6)
    gates.release(first)
    third = gates.acquire(config, holder="c")  # a slot came free
    assert GateSlot.objects.filter(provider="g").count() == 2
    gates.release(second)
    gates.release(third)
    assert not GateSlot.objects.filter(provider="g").exists()


def test_in_flight_gate__an_abandoned_slot_expires_instead_of_leaking():
    config = build("g", {"max_in_flight": 1, "total_timeout": 5})
    dead = gates.acquire(config, holder="worker that was SIGKILLed")
    with pytest.raises(GateClosed):
        gates.acquire(config)
    slot = GateSlot.objects.get(pk=dead.slot_id)
    # The slot lives for the total timeout plus a margin: its request is surely over then.
    lifetime = (slot.expires_at - slot.acquired_at).total_seconds()
    assert lifetime == 5 + gates.SLOT_MARGIN
    GateSlot.objects.filter(pk=dead.slot_id).update(expires_at=timezone.now() - timedelta(1))
    alive = gates.acquire(config)
    assert not GateSlot.objects.filter(pk=dead.slot_id).exists()
    gates.release(alive)


def test_spacing_gate__reschedules_for_when_the_gate_opens():
    config = build("g", {"min_spacing_ms": 60_000})
    first = gates.acquire(config)
    with pytest.raises(GateClosed) as info:
        gates.acquire(config)
    opens = first.started_at + timedelta(seconds=60)
    assert opens <= info.value.at <= opens + timedelta(seconds=30)
    assert ProviderGate.objects.get(provider="g").last_start_at == first.started_at


def test_spacing_gate__passes_once_s_has_passed():
    config = build("g", {"min_spacing_ms": 1000})
    gates.acquire(config)
    ProviderGate.objects.filter(provider="g").update(
        last_start_at=timezone.now() - timedelta(seconds=1.01)
    )
    gates.acquire(config)


def test_client__a_closed_gate_sends_nothing(http_server, provider):
    from durable.http.client import client

    provider(max_in_flight=1)
    held = gates.acquire(client("test").config, holder="another worker")
    with pytest.raises(GateClosed):
        client("test").request("GET", http_server.url("/x"))
    assert http_server.requests() == []
    gates.release(held)
    assert client("test").request("GET", http_server.url("/x")).status == 200
    assert not GateSlot.objects.exists()  # released after the request


def test_client__releases_its_slot_even_when_the_request_fails(http_server, provider):
    from durable.http.client import client
    from durable.http.errors import HttpRetryLater

    provider(max_in_flight=1)
    http_server.reply("/x", Reply(503))
    with pytest.raises(HttpRetryLater):
        client("test").request("GET", http_server.url("/x"))
    assert not GateSlot.objects.exists()
    assert max_concurrency(http_server.requests()) == 1
