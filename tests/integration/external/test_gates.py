"""Provider gates on the real database, in this process (4 workers: test_deliveries_crash)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from durable.http import gates, network
from durable.http.config import build
from durable.http.errors import GateClosed, HttpRetryLater, TransactionOpen
from durable.http.models import GateSlot, ProviderGate

from ..servers import Reply

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

    provider(max_in_flight=1)
    http_server.reply("/busy", Reply(503))
    http_server.reply("/reset", Reply(body=b"x" * 5000, reset_after=10))
    for path in ("/busy", "/reset", "/busy"):  # K=1: each would be turned away if one leaked
        with pytest.raises(HttpRetryLater):
            client("test").request("GET", http_server.url(path))
        assert not GateSlot.objects.exists()
    assert len(http_server.requests()) == 3


def test_client__refuses_to_run_inside_an_open_transaction(http_server, provider):
    from durable.http.client import client

    provider(max_in_flight=1)
    with transaction.atomic(), pytest.raises(TransactionOpen, match="open transaction") as info:
        client("test").request("GET", http_server.url("/x"))
    assert info.value.code == "non_retryable"  # a programming error: fail, do not retry
    assert http_server.requests() == []
    assert not GateSlot.objects.exists()
    assert client("test").request("GET", http_server.url("/x")).status == 200  # outside: fine


def test_lock_wait__is_bounded_by_the_deadline_and_a_cap():
    assert gates.lock_wait(None) == gates.MAX_LOCK_WAIT
    assert gates.lock_wait(30.0) == gates.MAX_LOCK_WAIT
    assert gates.lock_wait(1.5) == 1.5
    assert gates.lock_wait(-1.0) == gates.MIN_LOCK_WAIT


@pytest.mark.django_db(transaction=True)  # another connection holds the gate's lock
def test_acquire__a_gate_locked_by_a_stuck_transaction_closes_instead_of_blocking():
    config = build("g", {"max_in_flight": 2, "gate_retry_seconds": 1})
    gates.release(gates.acquire(config))  # the gate row exists
    locked, done = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():  # SQLite: BEGIN IMMEDIATE takes the write lock
                ProviderGate.objects.select_for_update().filter(provider="g").update(
                    last_start_at=None
                )
                locked.set()
                done.wait(10)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        with network.deadline(0.5), pytest.raises(GateClosed, match="stayed locked") as info:
            gates.acquire(config)
        waited = time.monotonic() - started
        assert 0.4 <= waited < 2.0  # the deadline's 0.5 s, not until the holder lets go
        assert info.value.consume_attempt is False
        assert timezone.now() < info.value.at <= timezone.now() + timedelta(seconds=1.6)
    finally:
        done.set()
        holder.join(10)
    gates.release(gates.acquire(config))  # and the gate works again once it is free


def test_turn_aways__counted_on_the_gate_row_per_cause_with_the_wait():
    full = build("full", {"max_in_flight": 1, "gate_retry_seconds": 2})
    held = gates.acquire(full)
    for _ in range(3):
        with pytest.raises(GateClosed):
            gates.acquire(full)
    spaced = build("spaced", {"min_spacing_ms": 60_000})
    gates.acquire(spaced)
    with pytest.raises(GateClosed):
        gates.acquire(spaced)
    counts = {
        gate.provider: (gate.waits_in_flight, gate.waits_spacing, gate.wait_seconds)
        for gate in ProviderGate.objects.all()
    }
    in_flight, spacing, waited = counts["full"]
    assert (in_flight, spacing) == (3, 0)
    assert 3 * 1.0 <= waited <= 3 * 3.0  # 2 s jittered by 0.5-1.5, three times
    in_flight, spacing, waited = counts["spaced"]
    assert (in_flight, spacing) == (0, 1)
    assert 59 <= waited <= 91  # until the gate opens, plus up to half the spacing
    gates.release(held)
    gates.acquire(full)  # a pass counts nothing
    assert ProviderGate.objects.get(provider="full").waits_in_flight == 3


def test_turned_away__adds_one_to_the_cause_and_the_wait_in_seconds():
    now = timezone.now()
    decision = gates.GateDecision(
        False, now + timedelta(seconds=4), "2 of 2 in flight", cause="in_flight"
    )
    updates = gates.turned_away(decision, now)
    assert set(updates) == {"waits_in_flight", "wait_seconds"}
    late = gates.GateDecision(False, now - timedelta(seconds=1), "x", cause="spacing")
    assert "waits_spacing" in gates.turned_away(late, now)
