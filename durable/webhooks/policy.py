"""Webhook decisions as pure functions: event filters, idempotency keys, the body, the signature.

The signature scheme, for receivers (docs/how-to/webhooks-and-mail.md, "Verifying a
webhook", has a copy-paste example)::

    X-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + raw body)>

Verify over the *raw* request body bytes, compare in constant time, and
reject timestamps older than a few minutes to stop replays of a captured
request. ``Idempotency-Key`` is the same on every retry and redelivery of
one event to one endpoint: store it and ignore repeats.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import uuid
from collections.abc import Iterable
from typing import Any

SIGNATURE_HEADER = "X-Signature"
SIGNATURE_VERSION = "v1"
DEFAULT_TOLERANCE = 300  # seconds a receiver should accept a timestamp for
_KEY_NAMESPACE = uuid.UUID("6f1c3f1e-6c43-4c4f-9a57-2d1f0c1de2a1")


def matches(patterns: Iterable[str] | None, event_type: str) -> bool:
    """Glob patterns (``job.*``, ``recovery.corruption-*``); an empty filter matches everything."""
    items = [p.strip() for p in (patterns or []) if isinstance(p, str) and p.strip()]
    return not items or any(fnmatch.fnmatchcase(event_type, p) for p in items)


def idempotency_key(event_id: str, destination: str) -> str:
    """Stable for one event and one destination: retries and redeliveries send the same key."""
    return str(uuid.uuid5(_KEY_NAMESPACE, f"{event_id}\x00{destination}"))


def body(*, event_id: str, event_type: str, created_at: str, summary: str, data: Any) -> bytes:
    """The JSON the receiver gets; byte-identical on every retry of one delivery."""
    document = {
        "id": event_id,
        "type": event_type,
        "created_at": created_at,
        "summary": summary,
        "data": data,
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def signature(secret: str, timestamp: int, payload: bytes) -> str:
    mac = hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode("ascii") + payload, "sha256")
    return f"t={timestamp},{SIGNATURE_VERSION}={mac.hexdigest()}"


def verify(
    secret: str, header: str, payload: bytes, *, now: float, tolerance: float = DEFAULT_TOLERANCE
) -> bool:
    """What a receiver does: parse ``t`` and ``v1``, check the age, compare in constant time."""
    parts: dict[str, list[str]] = {}
    for item in (header or "").split(","):
        key, sep, value = item.strip().partition("=")
        if sep:
            parts.setdefault(key, []).append(value)
    try:
        timestamp = int(parts["t"][0])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance:
        return False
    expected = signature(secret, timestamp, payload).rsplit("=", 1)[1]
    return any(
        hmac.compare_digest(expected, candidate) for candidate in parts.get(SIGNATURE_VERSION, [])
    )


def content_id(fields: dict[str, Any]) -> str:
    """A stable id for an event that has none of its own: the hash of its canonical content."""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
