"""Per-provider gates in the database: at most K requests in flight, at least S ms between starts.

Every worker process on every machine passes the same gate, because the gate
is a row: passing it is one short transaction that locks the provider's
``ProviderGate`` row (PostgreSQL: ``SELECT … FOR UPDATE``; SQLite: the write
lock every transaction takes with ``BEGIN IMMEDIATE``), drops expired slots,
counts live ones, compares the last start with the database's clock, and
records the new start and slot. A request that cannot pass is not blocked:
the caller raises ``GateClosed`` (a ``RetryLater`` that spends no attempt) and
the job is rescheduled for about when the gate should open.

A worker that dies while its request is in flight leaves its slot behind;
the slot expires after the provider's total timeout plus ``SLOT_MARGIN``.
Because the client's deadline starts before the gate is passed and bounds
the whole exchange, the dead worker's request cannot still be running then.

Min spacing holds between *gate passes*, on the database clock. The request
reaches the server a moment later (connect, write); that moment varies by
a few milliseconds, so a server may see two starts slightly closer than S.

Passing never waits long for the row: the lock wait is bounded by
``MAX_LOCK_WAIT`` and by the time left on the request's deadline
(PostgreSQL ``lock_timeout``; SQLite's busy timeout), and a gate that stays
locked — by a process stuck inside its transaction, or SQLite's "database is
locked" — is a ``GateClosed`` like a full one: rescheduled, no attempt spent.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, OperationalError, connection, transaction
from django.db.models import F
from django.utils import timezone

from ..models import database_now
from ..models.http import GateSlot, ProviderGate
from . import network
from .config import ProviderConfig
from .errors import GateClosed

log = logging.getLogger("durable.http")

SLOT_MARGIN = 10.0  # seconds beyond the total timeout before a slot counts as abandoned
# Passing a gate takes milliseconds; a row locked for longer than this is stuck, not busy.
MAX_LOCK_WAIT = 5.0
MIN_LOCK_WAIT = 0.05
CAUSES = ("in_flight", "spacing")  # why a gate turns a request away


@dataclass(frozen=True)
class GateDecision:
    passed: bool
    retry_at: datetime | None = None
    reason: str = ""
    cause: str = ""  # "in_flight" or "spacing" when not passed: a metrics label


def turned_away(decision: GateDecision, now: datetime) -> dict[str, Any]:
    """The gate row's counter updates for a request turned away. Pure."""
    assert decision.retry_at is not None
    assert decision.cause in CAUSES
    waited = max((decision.retry_at - now).total_seconds(), 0.0)
    column = f"waits_{decision.cause}"
    return {column: F(column) + 1, "wait_seconds": F("wait_seconds") + waited}


def decide(
    *,
    now: datetime,
    in_flight: int,
    last_start: datetime | None,
    max_in_flight: int,
    min_spacing_ms: int,
    retry_seconds: float,
    rng: random.Random | None = None,
) -> GateDecision:
    """Pure: may a request start at ``now``? If not, when should its job look again.

    The retry time is jittered so that the units turned away together do not
    all come back at the same instant and collide again.
    """
    rng = rng or random.Random()
    if max_in_flight and in_flight >= max_in_flight:
        delay = retry_seconds * rng.uniform(0.5, 1.5)
        return GateDecision(
            False,
            now + timedelta(seconds=delay),
            f"{in_flight} of {max_in_flight} in flight",
            cause="in_flight",
        )
    if min_spacing_ms and last_start is not None:
        spacing = timedelta(milliseconds=min_spacing_ms)
        opens = last_start + spacing
        if now < opens:
            jitter = timedelta(milliseconds=min_spacing_ms * rng.uniform(0.0, 0.5))
            return GateDecision(
                False, opens + jitter, f"within {min_spacing_ms} ms of the last", cause="spacing"
            )
    return GateDecision(True)


def lock_wait(remaining: float | None, cap: float = MAX_LOCK_WAIT) -> float:
    """Pure: how long passing the gate may wait for its row, in seconds."""
    if remaining is None:
        return cap
    return max(MIN_LOCK_WAIT, min(cap, remaining))


def is_lock_timeout(exc: BaseException, vendor: str) -> bool:
    """Pure: did this database error say "the lock was not free in time"?"""
    if vendor == "postgresql":
        # 55P03 lock_not_available: lock_timeout expired.
        return getattr(exc.__cause__, "sqlstate", None) == "55P03"
    if vendor == "sqlite":
        return "database is locked" in str(exc) or "database table is locked" in str(exc)
    return False


@contextmanager
def _bounded_lock_wait(seconds: float) -> Iterator[None]:
    """SQLite: the busy timeout governs ``BEGIN IMMEDIATE``; set it for this block only.

    (PostgreSQL sets ``lock_timeout`` locally inside the transaction instead.)
    """
    if connection.vendor != "sqlite":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        before = int(cursor.fetchone()[0])
        cursor.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA busy_timeout = {before}")


@dataclass(frozen=True)
class GatePass:
    provider: str
    slot_id: int | None
    started_at: datetime


def _locked_gate(provider: str) -> ProviderGate:
    gate = ProviderGate.objects.select_for_update().filter(provider=provider).first()
    if gate is not None:
        return gate
    try:
        with transaction.atomic():
            return ProviderGate.objects.create(provider=provider)
    except IntegrityError:  # another process created it first
        return ProviderGate.objects.select_for_update().get(provider=provider)


def acquire(config: ProviderConfig, *, holder: str = "") -> GatePass:
    """Pass the provider's gate or raise ``GateClosed`` with the time to try again."""
    wait = lock_wait(network.remaining())
    try:
        with _bounded_lock_wait(wait):
            return _acquire(config, holder=holder, wait=wait)
    except OperationalError as exc:
        if not is_lock_timeout(exc, connection.vendor):
            raise
        retry = config.gate_retry_seconds * random.uniform(0.5, 1.5)
        raise GateClosed(
            f"{config.name}: gate closed (its row stayed locked for {wait:g}s)",
            at=timezone.now() + timedelta(seconds=retry),
        ) from None


def _acquire(config: ProviderConfig, *, holder: str, wait: float) -> GatePass:
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('lock_timeout', %s, true)", [f"{int(wait * 1000)}ms"]
                )
        gate = _locked_gate(config.name)
        now = database_now()
        live = GateSlot.objects.filter(provider=config.name)
        live.filter(expires_at__lt=now).delete()
        in_flight = live.count() if config.max_in_flight else 0
        decision = decide(
            now=now,
            in_flight=in_flight,
            last_start=gate.last_start_at,
            max_in_flight=config.max_in_flight,
            min_spacing_ms=config.min_spacing_ms,
            retry_seconds=config.gate_retry_seconds,
        )
        if decision.passed:
            slot_id = None
            if config.max_in_flight:
                expires = now + timedelta(seconds=config.total_timeout + SLOT_MARGIN)
                slot_id = GateSlot.objects.create(
                    provider=config.name, holder=holder[:255], acquired_at=now, expires_at=expires
                ).pk
            ProviderGate.objects.filter(pk=gate.pk).update(last_start_at=now)
            return GatePass(config.name, slot_id, now)
        # Counted, then committed: raising inside the block would roll the count back.
        ProviderGate.objects.filter(pk=gate.pk).update(**turned_away(decision, now))
    assert decision.retry_at is not None
    raise GateClosed(f"{config.name}: gate closed ({decision.reason})", at=decision.retry_at)


def release(gate_pass: GatePass) -> None:
    """Free the slot; if this fails (database gone or locked), the slot simply expires.

    Never raises: the request's own outcome matters more than the bookkeeping.
    """
    if gate_pass.slot_id is None:
        return
    try:
        GateSlot.objects.filter(pk=gate_pass.slot_id).delete()
    except DatabaseError:
        log.warning(
            "could not free a gate slot; it expires by itself",
            extra={"provider": gate_pass.provider, "slot": gate_pass.slot_id},
        )
