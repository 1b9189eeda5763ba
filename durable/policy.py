"""Retry and bookkeeping policy as pure functions: no ORM, no clock reads.

Every function takes what it needs (attempt number, ``now``, a random source)
so the tables in tests/unit can pin the behaviour down exactly.
"""

from __future__ import annotations

import random
import re
import traceback
import unicodedata
from datetime import datetime, timedelta
from typing import Any

MAX_ERROR_HISTORY = 20
# A worker beats every third of *its own* lease; one silent for twice that lease
# has certainly stopped renewing (its leases are gone too).
WORKER_ALIVE_LEASES = 2.0
MAX_ERROR_MESSAGE_BYTES = 2 * 1024
MAX_TRACEBACK_BYTES = 4 * 1024
TRUNCATION_MARK = "… [truncated]"


def backoff_delay(
    attempt: int, *, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base·2^(attempt-1))].

    Full jitter (rather than ±x%) is what spreads a thundering herd of workers
    that all failed at the same moment; ``attempt`` counts from 1.
    """
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    if base < 0 or cap < 0:
        raise ValueError("base and cap must not be negative")
    # 2**attempt overflows float for absurd attempt counts; the cap wins long before.
    exponent = min(attempt - 1, 62)
    ceiling = min(cap, base * (2.0**exponent))
    return (rng or random).uniform(0.0, ceiling)


def truncate_utf8(text: str, limit: int, *, keep: str = "head") -> str:
    """Cut ``text`` to at most ``limit`` UTF-8 bytes without splitting a character."""
    encoded = text.encode("utf-8", errors="replace")
    if len(encoded) <= limit:
        return text
    room = max(limit - len(TRUNCATION_MARK.encode()), 0)
    if keep == "tail":
        cut = encoded[-room:].decode("utf-8", errors="ignore") if room else ""
        return TRUNCATION_MARK + cut
    return encoded[:room].decode("utf-8", errors="ignore") + TRUNCATION_MARK


# Shorter values are never redacted (they would turn ordinary words into holes and
# protect nothing), so every source of secrets refuses them (``credentials.resolve``).
MIN_SECRET_CHARS = 4


def redact(text: str, secrets: frozenset[str] | set[str]) -> str:
    """Replace every known secret value in ``text``; values under ``MIN_SECRET_CHARS``
    are ignored."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= MIN_SECRET_CHARS:
            text = text.replace(secret, "[redacted]")
    return text


MAX_SECRET_BYTES = 16 * 1024


def secret_problem(value: str) -> str | None:
    """Why ``value`` (already stripped) cannot be used as a secret, or None.

    What ``durable.credentials.resolve`` uses and what the encrypted table
    stores obey this one rule. The reason never quotes the value.
    """
    if len(value) < MIN_SECRET_CHARS:
        return f"it is shorter than {MIN_SECRET_CHARS} characters (too short to redact)"
    if len(value.encode("utf-8", errors="replace")) > MAX_SECRET_BYTES:
        return f"it is longer than {MAX_SECRET_BYTES} bytes"
    for char in value:
        if unicodedata.category(char) in ("Cc", "Zl", "Zp"):
            return "it contains a control character or a line break"
    return None


def error_entry(
    exc: BaseException,
    *,
    attempt: int,
    retryable: bool,
    now: datetime,
    secrets: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """One bounded, secret-free record of a failed attempt.

    An exception with a ``stands_for`` attribute is recorded as that one: a
    wrapper that carries a policy decision (retry at, give up) for an exception
    the worker cannot raise itself (a task's SystemExit) must not hide its class.
    """
    exc = getattr(exc, "stands_for", None) or exc
    cls = type(exc)
    name = (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
    message = redact(str(exc) or name, secrets)
    tb = "".join(traceback.format_exception(exc))
    return {
        "at": now.isoformat(),
        "attempt": attempt,
        "error_class": name,
        "message": truncate_utf8(message, MAX_ERROR_MESSAGE_BYTES),
        "retryable": retryable,
        "traceback": truncate_utf8(redact(tb, secrets), MAX_TRACEBACK_BYTES, keep="tail"),
    }


def append_bounded(
    history: list[dict[str, Any]] | None, entry: dict[str, Any], limit: int = MAX_ERROR_HISTORY
) -> list[dict[str, Any]]:
    """Keep the newest ``limit`` entries: the first failures matter less than the last."""
    items = [*(history or []), entry]
    return items[-limit:]


def deaths_without_progress(history: list[dict[str, Any]] | None, attempts: int) -> int:
    """How many of the last ``attempts`` failed attempts were lost workers that
    committed no unit (the rest: errors the units raised).

    Read from the bounded error history, where a death after progress is kept
    with ``attempt_spent: False``; entries of older releases count as spent.
    """
    if attempts <= 0:
        return 0
    spent = [entry for entry in history or [] if entry.get("attempt_spent", True)]
    return sum(entry.get("error_class") == "WorkerLost" for entry in spent[-attempts:])


RECLAIM_SPREAD_STEP = 0.1  # seconds of spread per job already taken back in the round
RECLAIM_SPREAD_CAP = 30.0


def reclaim_delay(
    position: int,
    *,
    step: float = RECLAIM_SPREAD_STEP,
    cap: float = RECLAIM_SPREAD_CAP,
    rng: random.Random | None = None,
) -> float:
    """Seconds until the ``position``-th job (from 0) taken back in one round is due.

    The first is due at once; the n-th uniformly within ``min(cap, n·step)``,
    so the jobs of a crashed fleet start gradually, with jitter, instead of
    all in the same instant on every restarted worker.
    """
    if position < 0:
        raise ValueError("position counts from 0")
    return (rng or random).uniform(0.0, min(cap, position * step))


def worker_alive(*, heartbeat_at: datetime, lease_seconds: float, now: datetime) -> bool:
    """Whether a worker that last beat at ``heartbeat_at`` still counts as running.

    Judged by the worker's own lease, not the observer's: a new worker started
    with ``--lease-seconds 10`` must not declare dead a peer running with 90 s
    leases that beats every 30 s (and then fail the jobs it left queued).
    """
    window = timedelta(seconds=max(lease_seconds, 0.0) * WORKER_ALIVE_LEASES)
    return heartbeat_at >= now - window


_DURATION = re.compile(r"^\s*(\d+)\s*(s|m|h|d|w)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``15m``, ``90s``, ``2w`` or bare seconds."""
    match = _DURATION.match(text or "")
    if not match:
        raise ValueError(
            f"{text!r} is not a duration: use a number with s, m, h, d or w (e.g. 30d)"
        )
    amount, unit = int(match.group(1)), (match.group(2) or "s").lower()
    return timedelta(seconds=amount * _UNIT_SECONDS[unit])
