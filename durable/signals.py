"""What the engine announces. ``recovery`` (or any app) subscribes; the engine never imports it.

Signals are sent after the transaction that caused them has committed, with
``send_robust``: a failing receiver is logged and can never undo or block the
engine's own write. One exception is an outbox: ``durable.builtin.announce``
sends ``recovery_event`` *inside* the transaction that marks the event sent
(with ``must_record=True``), so the receivers' rows commit with that marker or
not at all. Arguments are plain values (ids, strings, JSON), never
model instances, so a receiver may run anywhere.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.dispatch import Signal

log = logging.getLogger("durable.signals")

# job_id, operation, old_state, new_state, kind, message, data
job_state_changed = Signal()

# job_id, operation, previous_owner, policy, outcome, new_state, checkpoint,
# attempt, next_attempt_at, reason, attempt_spent (False: the lost lease had
# committed units_committed units, so the death spent no attempt)
job_reclaimed = Signal()

# A job stopped and needs a person: exhausted attempts, non-retryable failure,
# missing credential/storage, or failed by the restart policy.
# job_id, operation, state, cause, reason, checkpoint, attempt, next_attempt_at
job_needs_attention = Signal()

# Something an administrator should see in Problems → Recovery, reported by an
# operation (e.g. "backup-created", "corruption-detected"). Keyword arguments:
# type (required, non-empty), severity ("info" | "warning" | "error"), detail,
# db, source (default "worker"), done (True/False), deleted_data (bool),
# job_id, operation, checkpoint, attempt, object_ids, object_titles.
# Send with send_on_commit (inside the unit's transaction) or send_now. With
# must_record=True (an outbox, inside its transaction) a receiver that cannot
# write its rows must raise its DatabaseError instead of logging it.
recovery_event = Signal()

# A worker process finished restart recovery and is about to claim: worker_id, cold_start.
# Sent directly (not on commit), from the worker's main thread.
worker_started = Signal()

# Sent from every worker's housekeeping thread (not the one renewing leases) about
# every lease_seconds/3: worker_id.
# Receivers do small periodic chores (e.g. enqueue an ingest with a unique_key);
# they must be quick and must not raise.
worker_heartbeat = Signal()

# A security-relevant refusal (SSRF block, bad token...). category, key,
# detail, severity, cwe, source, user_id, username, ip
security_refusal = Signal()


def send_now(signal: Signal, **kwargs: Any) -> None:
    """Send outside any transaction; log receivers that fail, never raise."""
    for receiver, result in signal.send_robust(sender="durable", **kwargs):
        if isinstance(result, Exception):
            log.error(
                "signal receiver failed",
                extra={"receiver": getattr(receiver, "__qualname__", repr(receiver))},
                exc_info=result,
            )


def send_on_commit(signal: Signal, **kwargs: Any) -> None:
    """Send after the current transaction commits (or now, outside one)."""

    transaction.on_commit(lambda: send_now(signal, **kwargs), robust=True)
