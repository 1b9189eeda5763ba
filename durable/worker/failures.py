"""What a unit that raised leaves its job in: a retry, a failure, or the job handed back.

The decision (retryable or not, when to retry) is the operation's and the
policy's; this writes it, as one transition of ``durable.lease`` under the
job's row lock. A lease lost meanwhile means the job is someone else's now:
logged, never raised, so the executor thread goes on to its next job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import ParamSpec

from django.utils import timezone

from .. import tracing, transitions
from ..errors import LeaseLost, NonRetryable, RetryLater, Stopping, UnitTimeout
from ..policy import backoff_delay, error_entry
from .execution import Execution

log = logging.getLogger("durable.worker")

P = ParamSpec("P")


def stopped_early(execution: Execution, exc: Stopping) -> None:
    """A unit raised Stopping: hand the job back as asked, or count it if nobody asked."""
    if not execution.ctx.stop_requested.is_set():
        fail(execution, exc)  # unprompted: an ordinary failure, so it cannot loop
        return
    if execution.timed_out:
        timeout = execution.op.unit_timeout
        fail(
            execution,
            UnitTimeout(
                f"unit {execution.unit_key!r} ran longer than its unit_timeout of "
                f"{timeout:g}s and stopped when asked"
            ),
        )
        return
    execution.ctx.logger.info(
        "unit stopped early; handing the job back",
        extra={"job": execution.ctx.job_id, "state": execution.observed_state},
    )
    # release() settles every case under the row lock: running -> queued at
    # once, cancelling -> cancelled, paused -> stays paused; no attempt spent.
    settle(transitions.release, execution.lease, "the unit stopped early")


def fail(execution: Execution, exc: Exception) -> None:
    """Record the unit's error: a retry at the time the policy says, or the job's end."""
    ctx, op, lease = execution.ctx, execution.op, execution.lease
    now = timezone.now()
    seen = frozenset(ctx.secrets)
    if isinstance(exc, RetryLater):
        entry = error_entry(exc, attempt=ctx.attempt, retryable=True, now=now, secrets=seen)
        retry_at, consume = exc.at, exc.consume_attempt
    elif isinstance(exc, (NonRetryable, *op.non_retryable)):
        entry = error_entry(exc, attempt=ctx.attempt, retryable=False, now=now, secrets=seen)
        retry_at, consume = None, True
    else:
        entry = error_entry(exc, attempt=ctx.attempt, retryable=True, now=now, secrets=seen)
        retry_at = op.next_retry_at(ctx, exc, now) or now + timedelta(
            seconds=backoff_delay(ctx.attempt, base=op.backoff_base, cap=op.backoff_max)
        )
        consume = True
    tracing.failed(entry)
    ctx.logger.warning(
        "unit failed",
        extra={
            "job": ctx.job_id,
            "attempt": ctx.attempt,
            "error_class": entry["error_class"],
            "error": entry["message"][:200],
            "retry_at": retry_at.isoformat() if retry_at else None,
        },
    )
    settle(
        transitions.record_failure,
        lease,
        entry,
        retry_at=retry_at,
        consume_attempt=consume,
        on_exhausted=op.on_exhausted,
        coalesce=execution.committed == 0,
    )


def settle(fn: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> None:
    """Write an outcome with ``fn``; a lease lost meanwhile is logged, not raised."""
    try:
        fn(*args, **kwargs)
    except LeaseLost as exc:
        log.warning("lease lost while recording an outcome", extra={"detail": str(exc)})
