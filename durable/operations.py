"""How a Django developer declares a durable operation.

An operation turns a job's input and checkpoint into a sequence of *units*.
Each unit has a stable idempotency key, a bounded payload, and the checkpoint
that becomes true once the unit is done. The engine runs every unit in the
same order (docs/explanation/guarantees.md) — skip if its result
exists, run, verify, then advance the checkpoint atomically and fenced by
the lease — so a crash repeats one unit, never the whole job. A minimal operation::

    from durable.operations import Operation, Unit, register

    @register
    class Resize(Operation):
        name = "images.resize"
        max_attempts = 8

        def units(self, ctx):
            start = (ctx.checkpoint or {}).get("next", 0)
            for index in range(start, len(ctx.input["paths"])):
                yield Unit(key=f"path:{index}", payload=ctx.input["paths"][index],
                           checkpoint={"next": index + 1})

        def run_unit(self, ctx, unit):
            return resize(unit.payload)  # must be safe to repeat
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from django.conf import settings

from .credentials import resolve
from .errors import NonRetryable, Stopping, UnknownOperation
from .sanitize import is_reference_key
from .states import JobState, OnRestart

if TYPE_CHECKING:  # pragma: no cover
    from datetime import datetime

MAX_UNIT_KEY_LENGTH = 255
MAX_UNIT_PAYLOAD_BYTES = 64 * 1024

log = logging.getLogger("durable.operations")


class Access:
    """Who may start an operation by hand (the dashboard's "New job", the HTTP API).

    ``ANYONE``: whoever may start jobs at all. ``PRIVILEGED``: only with the extra
    right (the ``durable.start_privileged_job`` permission, the API scope
    ``jobs:admin``), for operations that read or replace data beyond their own rows
    — a restore empties tables, a file move deletes sources, an import reads a
    server path. ``SYSTEM``: never by hand; the site enqueues it itself (deliveries,
    bulk actions). Management commands are run by whoever has the server's shell
    and are not limited by it.
    """

    ANYONE = "anyone"
    PRIVILEGED = "privileged"
    SYSTEM = "system"


def may_start(operation: Operation, *, privileged: bool) -> bool:
    """Whether a person or client may start ``operation`` by hand (or schedule it).

    The one rule the dashboard and the API both apply. SYSTEM, or a marking this
    code does not know (a typo, a newer release's), is closed to everyone.
    """
    if operation.access == Access.ANYONE:
        return True
    return operation.access == Access.PRIVILEGED and privileged


@dataclass(frozen=True)
class Unit:
    """One bounded, repeatable piece of work.

    ``key`` must be stable across restarts (derive it from the input and the
    position, never from time or randomness): it is the idempotency key that
    step 2 looks up and that external calls can forward to a provider.
    ``checkpoint`` is what the job's checkpoint becomes once this unit is done.
    """

    key: str
    payload: Any = None
    checkpoint: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError("a unit needs a non-empty string key")
        if len(self.key) > MAX_UNIT_KEY_LENGTH:
            raise ValueError(f"unit key longer than {MAX_UNIT_KEY_LENGTH} characters")


@dataclass
class JobContext:
    """What a unit sees of its job; built by the worker for each claim."""

    job_id: int
    operation: str
    input: dict[str, Any]
    checkpoint: Any
    attempt: int
    worker_id: str
    lease_epoch: int
    units_done: int = 0
    units_total: int | None = None
    stop_requested: threading.Event = field(default_factory=threading.Event)
    secrets: set[str] = field(default_factory=set)
    pending_events: list[tuple[str, str, dict]] = field(default_factory=list)
    logger: logging.Logger = log

    def should_stop(self) -> bool:
        """True once the worker is shutting down, or the job was paused or cancelled.

        A long unit may poll this and then ``raise Stopping()`` (or call
        ``stop_if_requested()``): the job is handed back without spending an
        attempt and the unit is repeated later, so what it did so far must be
        safe to repeat. Do not just return: a returned result is verified and
        committed, and the rest of the unit's work would be silently skipped.
        """
        return self.stop_requested.is_set()

    def stop_if_requested(self) -> None:
        """``raise Stopping`` if ``should_stop()``: a polling point for long units."""
        if self.should_stop():
            raise Stopping("the unit stopped early: the worker asked it to")

    def credential(self, name: str) -> str:
        """Resolve a credential reference at run time; the value is redacted from errors."""
        value = resolve(name)
        self.secrets.add(value)
        return value

    def event(self, kind: str, message: str = "", **data: Any) -> None:
        """Add an entry to the job's event log; it commits with the next checkpoint."""
        self.pending_events.append((kind, message, data))

    def set_total(self, total: int | None) -> None:
        self.units_total = total


class Operation:
    """Subclass, set ``name``, implement ``units`` and ``run_unit``, and ``@register``."""

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    description: ClassVar[str] = ""
    queue: ClassVar[str] = "default"
    priority: ClassVar[int] = 0
    max_attempts: ClassVar[int] = 5
    backoff_base: ClassVar[float] = 2.0
    backoff_max: ClassVar[float] = 300.0
    on_restart: ClassVar[str] = OnRestart.RESUME
    on_exhausted: ClassVar[str] = JobState.FAILED  # or JobState.PAUSED
    non_retryable: ClassVar[tuple[type[BaseException], ...]] = ()
    # Run each unit inside the transaction that advances the checkpoint. Right
    # for units whose only side effects are rows in this database: they become
    # exactly-once. Wrong for anything slow or external (it holds the write lock).
    atomic_units: ClassVar[bool] = False
    # When ``total_units`` says the unit just run is the last, the engine asks
    # ``units()`` for one more *before* that unit's commit, so that a "no more"
    # lets the commit complete the job too (one transaction instead of two). A
    # generator that decides from the results of the units it already yielded
    # (reads UnitResult of the unit just run) must set this False: it is then
    # asked only after each commit, and its job completes in a transaction of its own.
    look_ahead: ClassVar[bool] = True
    # Seconds a unit may run. Past it the unit is asked to stop (should_stop();
    # raising Stopping then counts as a failed attempt, UnitTimeout). If it is
    # still running a grace period later, the worker process drains its other
    # jobs and exits (status 70), so the job is taken back as after a crash: a
    # thread cannot be interrupted, and its lease is renewed until the process
    # is gone, so the unit never runs twice at once. None: no limit — a hung unit
    # holds its job until its worker is restarted.
    unit_timeout: ClassVar[float | None] = None
    # A django.forms.Form whose cleaned_data is the job's input: the dashboard's
    # "New job" page renders it. None: the page offers a JSON input field.
    input_form: ClassVar[type | None] = None
    # Who may start it from the dashboard or the API (see ``Access``).
    access: ClassVar[str] = Access.ANYONE

    # --- called on enqueue ------------------------------------------------------

    def clean_input(self, data: dict[str, Any]) -> dict[str, Any]:
        """Validate and normalise the input; raise ``InputRejected(field, why)``."""
        return data

    def unique_key(self, data: dict[str, Any]) -> str | None:
        """A key that admits one unfinished job at a time (None: no such limit).

        Called with the cleaned input whenever ``enqueue`` is not given a key, so
        every way of starting the job — command, dashboard, API, schedule — agrees;
        e.g. ``f"restore:{data['database']}"`` keeps two restores off one database.
        """
        return None

    def credential_refs(self, data: dict[str, Any]) -> Iterable[str]:
        """Credential names the job needs; missing ones pause it with a clear reason."""
        return [v for k, v in data.items() if is_reference_key(k) and isinstance(v, str)]

    # --- called by the worker -----------------------------------------------------

    def prepare(self, ctx: JobContext) -> None:
        """Check what the job needs before any unit runs; raise ``Unavailable`` if absent."""

    def total_units(self, ctx: JobContext) -> int | None:
        """How many units the whole job has, when that is cheap to know."""
        return None

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        """Yield the units still to do, starting after ``ctx.checkpoint``."""
        raise NotImplementedError

    def run_unit(self, ctx: JobContext, unit: Unit) -> Any:
        """Do one unit; return a small JSON result (stored as the unit's evidence)."""
        raise NotImplementedError

    def verify(self, ctx: JobContext, unit: Unit, result: Any) -> None:
        """Check the unit's result before the checkpoint moves; raise ``VerificationFailed``."""

    def next_retry_at(self, ctx: JobContext, exc: BaseException, now: datetime) -> datetime | None:
        """Override to schedule a retry yourself; None uses exponential backoff."""
        return None


_registry: dict[str, Operation] = {}
_lock = threading.Lock()


def register(cls: type[Operation]) -> type[Operation]:
    """Class decorator: make the operation known to enqueue and to workers."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} needs a name")
    with _lock:
        existing = _registry.get(cls.name)
        # Re-registering the same class (a module imported twice) is harmless.
        same = existing is not None and (
            type(existing).__module__,
            type(existing).__qualname__,
        ) == (cls.__module__, cls.__qualname__)
        if existing is not None and not same:
            raise ValueError(f"operation {cls.name!r} is already registered by {existing!r}")
        _registry[cls.name] = cls()
    return cls


def get_operation(name: str) -> Operation:
    try:
        return _registry[name]
    except KeyError:
        raise UnknownOperation(f"no operation named {name!r} is registered") from None


def registered() -> dict[str, Operation]:
    return dict(_registry)


def check_payload(unit: Unit) -> None:
    if unit.payload is None or isinstance(unit.payload, int | float | bool):
        return  # nothing to measure (checked once per unit: the hot path)
    size = len(json.dumps(unit.payload, default=str).encode())
    if size > MAX_UNIT_PAYLOAD_BYTES:
        raise NonRetryable(
            f"unit {unit.key!r}: payload is {size} bytes; the limit is {MAX_UNIT_PAYLOAD_BYTES}"
        )


def max_input_bytes() -> int:
    return int(getattr(settings, "DURABLE_MAX_INPUT_BYTES", 64 * 1024))
