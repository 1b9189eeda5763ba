"""Schedules through one API: add, change, enable, disable, remove, and ``tick``.

``tick(now)`` is what every worker calls on each heartbeat. When nothing is
due it is one index range scan. For a due schedule it takes the schedule's
row (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite's ``BEGIN IMMEDIATE``
serialises writers anyway), re-checks that it is still due, and then, in
that one transaction: records the ``Occurrence`` (unique per schedule and
scheduled time), enqueues its job, and moves ``next_run_at`` past ``now``.
A worker killed before the commit leaves nothing behind, so the occurrence
is applied later by someone; after the commit the schedule is no longer due
and the record exists, so nobody applies it again.

What an occurrence enqueues is the schedule's operation with its input. An
app may register a *trigger* for an operation to decide that itself (the
recovery app enqueues an ingest only when the events file changed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from .. import faults, signals
from ..errors import DurableError, InputRejected
from ..jobs import clean_job_input, enqueue
from ..models import Job, database_now
from ..models.schedules import Occurrence, Schedule
from ..operations import get_operation, max_input_bytes, registered
from ..policy import truncate_utf8
from ..rules import priority_from, queue_name_problem
from ..sanitize import clean_input
from .timing import (
    ON_TIME_GRACE,
    CatchUp,
    Rule,
    check_interval,
    describe,
    format_interval,
    normalise_cron,
    occurrence_key,
    plan,
    time_zone,
)

log = logging.getLogger("durable.schedules")

MAX_NAME_CHARS = 100
DUE_BATCH = 50


# --- triggers: what an occurrence enqueues ---------------------------------------------------


@dataclass(frozen=True)
class Due:
    """One occurrence being applied, as a trigger sees it (plain values only)."""

    schedule_id: int
    name: str
    operation: str
    input: dict[str, Any]
    queue: str
    priority: int | None
    overlap: bool
    scheduled_for: datetime
    worker: str

    @property
    def key(self) -> str:
        return occurrence_key(self.schedule_id, self.scheduled_for)

    @property
    def owner(self) -> str:
        return f"schedule:{self.name}"[:150]


Trigger = Callable[[Due], "Job | None"]
InputCheck = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class _Registered:
    trigger: Trigger
    check_input: InputCheck | None


_triggers: dict[str, _Registered] = {}


def register_trigger(
    operation: str, trigger: Trigger, *, check_input: InputCheck | None = None
) -> None:
    """Let ``trigger(due)`` decide what an occurrence of ``operation`` enqueues.

    It runs inside the transaction that records the occurrence and returns
    the job (or None: nothing to do this time). ``check_input`` validates a
    schedule's input when it is added (default: the operation's ``clean_input``).
    """
    _triggers[operation] = _Registered(trigger, check_input)


def enqueue_occurrence(due: Due) -> Job:
    """The default trigger: the schedule's operation and input, one job per occurrence.

    Without ``overlap``, while the previous occurrence's job is unfinished
    (slow, paused, waiting out a retry) a new occurrence gets that job back
    instead of a second one: the job carries the unique key ``schedule:<id>``.

    An operation with a unique key of its own (one restore per database, one
    move per pair of storages) keeps it, overlap or not: a schedule must never
    start a second writer next to a job started by hand. Its jobs then carry
    the operation's key, and "no overlap" is kept by looking up the previous
    occurrences' job here, under the schedule's row lock that this tick holds.
    """
    own_key = _operation_key(due)
    if own_key is None:
        return enqueue(
            due.operation,
            due.input,
            owner=due.owner,
            queue=due.queue or None,
            priority=due.priority,
            unique_key=None if due.overlap else f"schedule:{due.schedule_id}",
        )
    if not due.overlap and (previous := _unfinished_job_of(due.schedule_id)) is not None:
        previous.created = False
        return previous
    return enqueue(
        due.operation, due.input, owner=due.owner, queue=due.queue or None, priority=due.priority
    )


def _operation_key(due: Due) -> str | None:
    """The operation's own unique key for this input, cleaned as ``enqueue`` will clean it."""
    op = get_operation(due.operation)
    return op.unique_key(clean_job_input(op, dict(due.input)))


def _unfinished_job_of(schedule_id: int) -> Job | None:
    jobs = Occurrence.objects.filter(schedule_id=schedule_id, job_id__isnull=False)
    return Job.objects.unfinished().filter(pk__in=jobs.values("job_id")).order_by("-pk").first()


# --- validation ---------------------------------------------------------------------------------


def _check_input(operation: str, data: Any) -> dict[str, Any]:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputRejected("input", "must be a JSON object")
    registered_trigger = _triggers.get(operation)
    data = clean_input(data, max_bytes=max_input_bytes())
    if registered_trigger is not None and registered_trigger.check_input is not None:
        data = registered_trigger.check_input(data)
    elif registered_trigger is None:
        # Checked now, stored as given: what the operation fills in by itself (a
        # backup's time-stamped name) is filled in afresh for every occurrence's job;
        # frozen here, every occurrence after the first would ask for the same name.
        clean_job_input(get_operation(operation), dict(data))
    return clean_input(data, max_bytes=max_input_bytes())


def _timing(
    cron: str | None, every: timedelta | None, zone: str
) -> tuple[str, timedelta | None, str]:
    """The rule as stored: (cron, interval, zone); exactly one of cron and interval."""
    if bool(cron) == (every is not None):
        raise InputRejected("cron", "give a cron expression or an interval (exactly one)")
    if zone:
        try:
            time_zone(zone)
        except ValueError as exc:
            raise InputRejected("time_zone", str(exc)) from None
    if every is None:
        try:
            return normalise_cron(cron or ""), None, zone
        except ValueError as exc:
            raise InputRejected("cron", str(exc)) from None
    try:
        return "", check_interval(every), ""
    except ValueError as exc:
        raise InputRejected("interval", str(exc)) from None


def _fields(
    name: str,
    operation: str,
    *,
    cron: str | None,
    every: timedelta | None,
    input: dict[str, Any] | None,
    time_zone: str,
    catch_up: str,
    overlap: bool,
    queue: str,
    priority: int | None,
) -> dict[str, Any]:
    name = (name or "").strip()
    if not name or len(name) > MAX_NAME_CHARS or any(ch.isspace() and ch != " " for ch in name):
        raise InputRejected("name", f"1 to {MAX_NAME_CHARS} characters, no tabs or newlines")
    get_operation(operation)  # UnknownOperation names the problem
    cron_text, interval, zone = _timing(cron, every, (time_zone or "").strip())
    try:
        policy = CatchUp(catch_up)
    except ValueError:
        raise InputRejected("catch_up", "latest or skip") from None
    try:
        priority = None if priority is None else priority_from(priority)
    except ValueError as exc:
        raise InputRejected("priority", str(exc)) from None
    if queue:
        problem = queue_name_problem(queue)
        if problem is not None:
            raise InputRejected("queue", f"{problem}, or empty for the operation's queue")
    return {
        "name": name,
        "operation": operation,
        "input": _check_input(operation, input),
        "cron": cron_text,
        "interval": interval,
        "time_zone": zone,
        "catch_up": policy.value,
        "overlap": bool(overlap),
        "queue": queue or "",
        "priority": priority,
    }


def _first_run(schedule: Schedule, now: datetime) -> datetime:
    return schedule.rule.next_after(now)


# --- changing schedules --------------------------------------------------------------------------


def add_schedule(
    name: str,
    operation: str,
    *,
    cron: str | None = None,
    every: timedelta | None = None,
    input: dict[str, Any] | None = None,
    time_zone: str = "",
    catch_up: str = CatchUp.LATEST,
    overlap: bool = False,
    queue: str = "",
    priority: int | None = None,
    enabled: bool = True,
    now: datetime | None = None,
) -> Schedule:
    """Create a schedule; its first occurrence is the first one after ``now``.

    Raises ``InputRejected`` (which field, why) or ``UnknownOperation``; a
    name already taken is refused on ``name``.
    """
    fields = _fields(
        name, operation, cron=cron, every=every, input=input, time_zone=time_zone,
        catch_up=catch_up, overlap=overlap, queue=queue, priority=priority,
    )  # fmt: skip
    now = now or timezone.now()
    schedule = Schedule(**fields, enabled=enabled, created_at=now, updated_at=now)
    schedule.next_run_at = _first_run(schedule, now) if enabled else None
    try:
        with transaction.atomic():
            schedule.save(force_insert=True)
    except IntegrityError:
        raise InputRejected("name", f"a schedule named {fields['name']!r} exists") from None
    log.info("schedule added", extra=_log_fields(schedule))
    return schedule


def ensure_schedule(
    name: str,
    operation: str,
    *,
    cron: str | None = None,
    every: timedelta | None = None,
    input: dict[str, Any] | None = None,
    time_zone: str = "",
    catch_up: str = CatchUp.LATEST,
    overlap: bool = False,
    queue: str = "",
    priority: int | None = None,
    now: datetime | None = None,
) -> Schedule:
    """Create or update a schedule the site manages from its settings; idempotent.

    Keeps ``enabled`` as an operator left it. A changed timing moves the next
    occurrence to the first one after ``now`` under the new rule; an
    unchanged one keeps its ``next_run_at``, so calling this at every worker
    start never delays or repeats an occurrence.
    """
    fields = _fields(
        name, operation, cron=cron, every=every, input=input, time_zone=time_zone,
        catch_up=catch_up, overlap=overlap, queue=queue, priority=priority,
    )  # fmt: skip
    now = now or timezone.now()
    for _ in range(3):
        with transaction.atomic():
            schedule = Schedule.objects.select_for_update().filter(name=fields["name"]).first()
            if schedule is None:
                try:
                    with transaction.atomic():
                        schedule = Schedule(**fields, managed=True, created_at=now, updated_at=now)
                        schedule.next_run_at = _first_run(schedule, now)
                        schedule.save(force_insert=True)
                except IntegrityError:
                    continue  # created by another process meanwhile: update it instead
                log.info("schedule added", extra=_log_fields(schedule))
                return schedule
            timing = (schedule.cron, schedule.interval, schedule.time_zone)
            changed = [key for key, value in fields.items() if getattr(schedule, key) != value]
            if not changed and schedule.managed:
                return schedule
            for key in changed:
                setattr(schedule, key, fields[key])
            schedule.managed = True
            if (
                timing != (schedule.cron, schedule.interval, schedule.time_zone)
                and schedule.enabled
            ):
                schedule.next_run_at = _first_run(schedule, now)
            schedule.updated_at = now
            schedule.save()
            log.info("schedule updated", extra={**_log_fields(schedule), "changed": changed})
            return schedule
    raise RuntimeError(f"could not create or update schedule {name!r}")  # pragma: no cover


def set_enabled(name: str, enabled: bool, *, now: datetime | None = None) -> Schedule:
    """Enable or disable; returns the schedule. Raises ``Schedule.DoesNotExist``.

    Enabling starts from the first occurrence after ``now``: occurrences that
    fell while it was disabled are never caught up (disabled means "not these").
    """
    now = now or timezone.now()
    with transaction.atomic():
        schedule = Schedule.objects.select_for_update().get(name=name)
        if schedule.enabled == enabled:
            return schedule
        schedule.enabled = enabled
        schedule.next_run_at = _first_run(schedule, now) if enabled else None
        schedule.updated_at = now
        schedule.save(update_fields=["enabled", "next_run_at", "updated_at"])
    log.info("schedule enabled" if enabled else "schedule disabled", extra=_log_fields(schedule))
    return schedule


def remove_schedule(name: str) -> bool:
    """Delete a schedule and its occurrence records. Jobs it enqueued are not touched."""
    deleted, _ = Schedule.objects.filter(name=name).delete()
    if deleted:
        log.info("schedule removed", extra={"schedule": name})
    return bool(deleted)


# --- ticking ----------------------------------------------------------------------------------


def due_sql(now: datetime | None = None) -> tuple[str, list[Any]]:
    """The query behind ``due_schedules``: a range scan of the index ``durable_schedule_due``.

    ``statement_timestamp()``, not ``clock_timestamp()``: a volatile bound
    cannot be an index condition on PostgreSQL.
    """
    table = connection.ops.quote_name(Schedule._meta.db_table)
    if now is None and connection.vendor == "postgresql":
        bound, params = "statement_timestamp()", []
    else:
        bound = "%s"
        params = [connection.ops.adapt_datetimefield_value(now or timezone.now())]
    # SQLite uses a partial index only when the query repeats its WHERE term as written,
    # and Django wrote it as "enabled" up to 5.2 but "enabled" = 1 from 6.1: name both.
    enabled = "enabled AND enabled = 1" if connection.vendor == "sqlite" else "enabled"
    # The table name is quoted by the backend; the bound is a literal or a placeholder.
    sql = (
        f"SELECT id, operation FROM {table} WHERE {enabled} AND next_run_at <= {bound} "  # noqa: S608
        f"ORDER BY next_run_at LIMIT {DUE_BATCH}"
    )
    return sql, params


def due_schedules(now: datetime | None = None) -> list[tuple[int, str]]:
    """(id, operation) of the enabled schedules due at ``now`` (default: the database's clock).

    The one query every worker runs on every heartbeat, so it is written out
    and run on the cursor: building it through the ORM costs ten times the query.
    """
    sql, params = due_sql(now)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def tick(
    now: datetime | None = None, *, operations: Iterable[str] | None = None, worker: str = ""
) -> list[Occurrence]:
    """Apply every due occurrence of the schedules whose operation this process knows.

    Cheap when nothing is due: one index range scan (``due_schedules``).
    ``now`` is for tests; by default the database's clock decides (see
    ``database_now``). Returns the occurrences recorded by this call.
    """
    due = due_schedules(now)
    if not due:
        return []
    ops = set(registered() if operations is None else operations)
    recorded = []
    for schedule_id, operation in due:
        if operation not in ops:
            continue  # a worker without this operation's code leaves it to one that has it
        occurrence = apply_due(schedule_id, now=now, operations=ops, worker=worker)
        if occurrence is not None:
            recorded.append(occurrence)
    return recorded


def apply_due(
    schedule_id: int,
    *,
    now: datetime | None = None,
    operations: Iterable[str] | None = None,
    worker: str = "",
) -> Occurrence | None:
    """One due schedule: record its occurrence, enqueue its job, move it on — one transaction.

    None if another worker got there first (the row is locked, or no longer due).
    """
    with transaction.atomic():
        schedule = (
            Schedule.objects.select_for_update(skip_locked=True)
            .filter(pk=schedule_id, enabled=True)
            .first()
        )
        if schedule is None:
            return None
        moment = now or database_now()
        if schedule.next_run_at is None or schedule.next_run_at > moment:
            return None  # another worker applied it between our look and our lock
        if operations is not None and schedule.operation not in set(operations):
            return None
        decision = plan(schedule.rule, schedule.next_run_at, moment, schedule.catch_up)
        overdue = moment - schedule.next_run_at  # > the grace: no worker ticked for a while
        occurrence = _record(schedule, decision.latest, decision.missed, worker, moment)
        if occurrence is not None:
            if decision.run:
                _enqueue(schedule, occurrence, worker)
            else:
                occurrence.note = _skipped_note(decision.missed, moment - decision.latest)
            if decision.missed_capped:
                occurrence.note = f"{occurrence.note} (at least {decision.missed} missed)"
            occurrence.save(update_fields=["job_id", "note"])
        schedule.next_run_at = decision.next_run_at
        schedule.last_run_at = decision.latest
        schedule.updated_at = moment
        schedule.save(update_fields=["next_run_at", "last_run_at", "updated_at"])
        if occurrence is not None and overdue > ON_TIME_GRACE:
            _report_catch_up(schedule, occurrence, decision.run, overdue)
        faults.reach("schedules.before_commit")
    faults.reach("schedules.after_commit")
    if occurrence is not None:
        log.info(
            "schedule occurrence applied",
            extra={
                "schedule": schedule.name,
                "scheduled_for": occurrence.scheduled_for.isoformat(),
                "job": occurrence.job_id,
                "missed": occurrence.missed,
                "note": occurrence.note,
                "worker": worker,
            },
        )
    return occurrence


def _record(
    schedule: Schedule, scheduled_for: datetime, missed: int, worker: str, now: datetime
) -> Occurrence | None:
    """Insert the occurrence; None if it is recorded already (the unique constraint says so)."""
    occurrence = Occurrence(
        schedule=schedule,
        scheduled_for=scheduled_for,
        missed=missed,
        worker=worker[:200],
        created_at=now,
    )
    try:
        with transaction.atomic():
            occurrence.save(force_insert=True)
    except IntegrityError:
        log.warning(
            "occurrence already recorded; not applying it again",
            extra={"schedule": schedule.name, "scheduled_for": scheduled_for.isoformat()},
        )
        return None
    return occurrence


def _enqueue(schedule: Schedule, occurrence: Occurrence, worker: str) -> None:
    due = Due(
        schedule_id=schedule.pk,
        name=schedule.name,
        operation=schedule.operation,
        input=schedule.input,
        queue=schedule.queue,
        priority=schedule.priority,
        overlap=schedule.overlap,
        scheduled_for=occurrence.scheduled_for,
        worker=worker,
    )
    registered_trigger = _triggers.get(schedule.operation)
    trigger = registered_trigger.trigger if registered_trigger else enqueue_occurrence
    try:
        with transaction.atomic():
            job = trigger(due)
    except DatabaseError:
        raise  # the transaction is gone: nothing is recorded, a later tick applies it
    except Exception as exc:
        # A refusal (input no longer valid, a trigger's bug) is recorded, not
        # retried on every heartbeat; the operator sees it in Recovery.
        reason = truncate_utf8(f"{type(exc).__name__}: {exc}", 200)
        occurrence.note = f"not enqueued: {reason}"
        log.error(
            "schedule occurrence refused",
            extra={"schedule": schedule.name, "error": reason},
            exc_info=not isinstance(exc, DurableError),
        )
        signals.send_on_commit(
            signals.recovery_event,
            type="schedule-failed",
            severity="error",
            source="worker",
            done=False,
            detail=(
                f"Schedule {schedule.name!r} ({schedule.operation}) could not enqueue its "
                f"occurrence {_iso(occurrence.scheduled_for)}: {reason}"
            ),
            operation=schedule.operation,
        )
        return
    if job is None:
        occurrence.note = "nothing to do"
        return
    occurrence.job_id = job.pk
    created = getattr(job, "created", True)
    occurrence.note = (
        f"enqueued job {job.pk}"
        if created
        else f"job {job.pk} of an earlier occurrence is still {job.state}: not enqueued again"
    )


def _skipped_note(missed: int, late: timedelta) -> str:
    return f"skipped (catch-up: skip): this occurrence was {_human(late)} late" + (
        f", and {missed} earlier one(s) with it" if missed else ""
    )


def _report_catch_up(
    schedule: Schedule, occurrence: Occurrence, ran: bool, overdue: timedelta
) -> None:
    """Occurrences missed while no worker ticked: one warning in Problems → Recovery."""
    if ran:
        what = (
            f"ran once for {_iso(occurrence.scheduled_for)}"
            + (
                f"; {occurrence.missed} earlier occurrence(s) were not run"
                if occurrence.missed
                else ""
            )
            + " (catch-up: latest)"
        )
    else:
        what = f"skipped {occurrence.missed + 1} missed occurrence(s) (catch-up: skip)"
    signals.send_on_commit(
        signals.recovery_event,
        type="schedule-caught-up",
        severity="warning",
        source="worker",
        detail=(
            f"Schedule {schedule.name!r} ({schedule.operation}) was not ticked for "
            f"{_human(overdue)} (no worker running?): {what}."
        ),
        job_id=occurrence.job_id,
        operation=schedule.operation,
    )


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _human(delta: timedelta) -> str:
    return format_interval(timedelta(seconds=round(delta.total_seconds())))


def _log_fields(schedule: Schedule) -> dict[str, Any]:
    return {
        "schedule": schedule.name,
        "operation": schedule.operation,
        "rule": describe_rule(schedule),
        "enabled": schedule.enabled,
        "next_run_at": schedule.next_run_at.isoformat() if schedule.next_run_at else None,
    }


def describe_rule(schedule: Schedule) -> str:
    return describe(Rule(cron=schedule.cron, every=schedule.interval, zone=schedule.zone))
