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

from .outage import describe, is_unreachable

log = logging.getLogger("durable.signals")


class EngineSignal(Signal):
    """A signal whose failing receivers ``send_now`` logs, on one line, instead of Django.

    Django's ``send_robust`` logs every failing receiver with its traceback
    (``django.dispatch``) before handing the error back; its caller here logs it
    again, knowing better: through a database outage every heartbeat would
    write a traceback twice. Overriding this hook is how Django means it to be
    changed (the other ``send_robust`` caller, ``durable.builtin.announce``,
    logs its receivers' failures itself too).
    """

    def _log_robust_failure(self, receiver: Any, err: Exception) -> None:
        return None


# job_id, operation, old_state, new_state, kind, message, data
job_state_changed = EngineSignal()

# job_id, operation, previous_owner, policy, outcome, new_state, checkpoint,
# attempt, next_attempt_at, reason, attempt_spent (False: the lost lease had
# committed units_committed units, so the death spent no attempt)
job_reclaimed = EngineSignal()

# A job stopped and needs a person: exhausted attempts, non-retryable failure,
# missing credential/storage, or failed by the restart policy.
# job_id, operation, state, cause, reason, checkpoint, attempt, next_attempt_at
job_needs_attention = EngineSignal()

# Something an administrator should see in Problems → Recovery, reported by an
# operation (e.g. "backup-created", "corruption-detected"). Keyword arguments:
# type (required, non-empty), severity ("info" | "warning" | "error"), detail,
# db, source (default "worker"), done (True/False), deleted_data (bool),
# job_id, operation, checkpoint, attempt, object_ids, object_titles.
# Send with send_on_commit (inside the unit's transaction) or send_now. With
# must_record=True (an outbox, inside its transaction) a receiver that cannot
# write its rows must raise its DatabaseError instead of logging it.
recovery_event = EngineSignal()

# A worker process finished restart recovery and is about to claim: worker_id, cold_start.
# Sent directly (not on commit), from the worker's main thread.
worker_started = EngineSignal()

# Sent from every worker's housekeeping thread (not the one renewing leases) about
# every lease_seconds/3: worker_id.
# Receivers do small periodic chores (e.g. enqueue an ingest with a unique_key);
# they must be quick and must not raise.
worker_heartbeat = EngineSignal()

# A security-relevant refusal (SSRF block, bad token...). category, key,
# detail, severity, cwe, source, user_id, username, ip
security_refusal = EngineSignal()


def send_now(signal: Signal, *, raise_unreachable: bool = False, **kwargs: Any) -> None:
    """Send outside any transaction; log receivers that fail, never raise — but see below.

    A receiver that failed because the database is unreachable is logged on one
    line without its traceback (every receiver fails the same way through an
    outage). With ``raise_unreachable`` it is not logged at all: the first such
    error is raised once every receiver has run, for a caller that tracks the
    outage itself (the worker's housekeeping, which sends ``worker_heartbeat``
    every few seconds, says once that the database is gone, not once per beat).
    """
    if not signal.receivers:
        return  # nobody listens: not even send_robust's lookup
    lost: BaseException | None = None
    for receiver, result in signal.send_robust(sender="durable", **kwargs):
        if not isinstance(result, Exception):
            continue
        name = getattr(receiver, "__qualname__", repr(receiver))
        if not is_unreachable(result):
            log.error("signal receiver failed", extra={"receiver": name}, exc_info=result)
        elif raise_unreachable:
            lost = lost or result
        else:
            log.warning(
                "signal receiver failed: database unreachable",
                extra={"receiver": name, "error": describe(result)},
            )
    if lost is not None:
        raise lost


def send_on_commit(signal: Signal, **kwargs: Any) -> None:
    """Send after the current transaction commits (or now, outside one).

    A signal nobody listens to is not sent at all (one is sent per job state
    change, thousands a second on a busy worker); a receiver connected between
    this call and the commit does not hear of it. Outside a transaction the
    signal goes now, without Django's ``on_commit`` bookkeeping (``send_now``
    never raises on a receiver's behalf, so it cannot fail the caller either).
    """
    if not signal.receivers:
        return
    if not transaction.get_connection().in_atomic_block:
        send_now(signal, **kwargs)
        return
    transaction.on_commit(lambda: send_now(signal, **kwargs), robust=True)
