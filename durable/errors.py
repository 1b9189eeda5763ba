"""What a unit raises to steer the engine, and what the engine raises to callers."""

from __future__ import annotations

from datetime import datetime


class DurableError(Exception):
    """Base class for this package's errors."""


class RetryLater(DurableError):
    """Reschedule the job at ``at`` (an aware datetime) instead of backing off.

    ``consume_attempt=False`` is for gates (rate limits we impose on ourselves):
    the job did not really try, so it keeps its attempt budget.
    """

    def __init__(self, reason: str, *, at: datetime, consume_attempt: bool = True):
        super().__init__(reason)
        self.at = at
        self.consume_attempt = consume_attempt


class NonRetryable(DurableError):
    """A verdict, not a glitch: the job fails now with this reason."""

    code = "non_retryable"


class Unavailable(DurableError):
    """A credential or storage the job needs is missing: pause with this actionable reason."""


class VerificationFailed(DurableError):
    """A unit ran but its result did not check out; the unit is retried."""


class Stopping(DurableError):
    """Raised by a unit that saw ``ctx.should_stop()`` and stopped before finishing.

    Nothing of the unit is committed (an atomic unit's rows roll back); the job
    is handed back as asked — released to the queue on shutdown, left paused,
    or cancelled — with **no attempt spent**, and the unit runs again later.
    Raised when nothing asked the unit to stop, it counts as an ordinary
    retryable failure, so a unit cannot loop on it.
    """


class UnitTimeout(DurableError):
    """A unit ran past its operation's ``unit_timeout`` and stopped when asked: an attempt."""


class LeaseLost(DurableError):
    """This worker no longer holds the job (expired and reclaimed, or cancelled)."""


class InputRejected(DurableError, ValueError):
    """Enqueue refused the input; ``field`` says where, the message says why."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


class UnknownOperation(DurableError, LookupError):
    pass


class TransitionRefused(DurableError):
    """The job's state does not allow the requested action."""
