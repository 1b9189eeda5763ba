"""The durable job record, its event log and its unit results.

Rows here are changed only through ``durable.jobs`` (operator actions) and the
worker (``durable.worker``); every such write is one conditional update plus its
event, in one transaction. Application code reads them through the
``Job.objects`` query methods below.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q
from django.utils import timezone

from ..rules import PRIORITY_MAX, PRIORITY_MIN, QUEUE_NAME_MAX, UNIQUE_KEY_MAX
from ..states import FINISHED_STATES, LEASED_STATES, UNFINISHED_STATES, JobState, OnRestart
from .clock import db_now


class JobQuerySet(models.QuerySet):
    def due(self, now: datetime | None = None) -> JobQuerySet:
        return self.filter(state=JobState.QUEUED, next_attempt_at__lte=now or timezone.now())

    def expired_leases(self, now: datetime | None = None) -> JobQuerySet:
        return self.filter(
            state__in=LEASED_STATES,
            lease_owner__isnull=False,
            lease_expires_at__lt=now or timezone.now(),
        )

    def active(self) -> JobQuerySet:
        """Jobs a worker is on or will be on: what the dashboard refreshes for."""
        return self.filter(state__in=[JobState.QUEUED, JobState.RUNNING, JobState.CANCELLING])

    def unfinished(self) -> JobQuerySet:
        return self.filter(state__in=UNFINISHED_STATES)

    def finished(self) -> JobQuerySet:
        return self.filter(state__in=FINISHED_STATES)

    def retrying(self, now: datetime | None = None) -> JobQuerySet:
        """Waiting out a backoff after at least one failed attempt."""
        return self.filter(
            state=JobState.QUEUED, attempts__gt=0, next_attempt_at__gt=now or timezone.now()
        )

    def with_clock(self) -> JobQuerySet:
        """Annotate ``lease_held`` and ``due``, compared in SQL on the lease clock."""
        now = db_now()
        return self.annotate(
            lease_held=models.ExpressionWrapper(
                Q(lease_owner__isnull=False, lease_expires_at__gt=now),
                output_field=models.BooleanField(),
            ),
            due=models.ExpressionWrapper(
                Q(next_attempt_at__lte=now), output_field=models.BooleanField()
            ),
        )

    def purgeable(self, older_than: datetime) -> JobQuerySet:
        return self.finished().filter(finished_at__lt=older_than)


# The unique key's partial index holds jobs in these states, in this order: SQLite
# uses a partial index only for a query that repeats its condition word for word
# (durable.sql.base.KEY_HOLDERS does).
UNIQUE_KEY_STATES = ["queued", "running", "paused", "cancelling"]


class Job(models.Model):
    operation = models.CharField(max_length=100)
    owner = models.CharField(max_length=150, blank=True, default="")
    tenant = models.CharField(max_length=100, blank=True, default="")
    queue = models.CharField(max_length=QUEUE_NAME_MAX, default="default")
    priority = models.SmallIntegerField(
        default=0, help_text=f"Higher runs first ({PRIORITY_MIN}…{PRIORITY_MAX})."
    )
    input = models.JSONField(default=dict, blank=True, help_text="Sanitized: never a secret.")
    # At most one unfinished job per unique_key (e.g. "ingest:/var/x.jsonl"):
    # enqueue returns the existing one instead of adding a second.
    unique_key = models.CharField(max_length=UNIQUE_KEY_MAX, null=True, blank=True)  # noqa: DJ001

    state = models.CharField(max_length=12, choices=JobState.choices, default=JobState.QUEUED)
    on_restart = models.CharField(max_length=8, choices=OnRestart.choices, default=OnRestart.RESUME)
    checkpoint = models.JSONField(null=True, blank=True)
    units_done = models.PositiveBigIntegerField(default=0)
    units_total = models.PositiveBigIntegerField(null=True, blank=True)
    # units_done when the current lease was claimed (NULL: never claimed, or by a
    # release that did not record it): a worker lost after committing more units
    # made progress, and its death spends no attempt.
    units_at_claim = models.PositiveBigIntegerField(null=True, blank=True, editable=False)

    attempts = models.PositiveIntegerField(default=0, help_text="Failed attempts so far.")
    max_attempts = models.PositiveIntegerField(default=5)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    errors = models.JSONField(default=list, blank=True, help_text="The newest 20 failures.")
    last_error_class = models.CharField(max_length=200, blank=True, default="")
    reason = models.TextField(blank=True, default="", help_text="Why it is paused or failed.")
    error_code = models.CharField(max_length=64, blank=True, default="")
    reclaims = models.PositiveIntegerField(
        default=0, help_text="Times restart recovery took it back."
    )

    # NULL, not "", means "no lease": the lease index is partial on IS NOT NULL.
    lease_owner = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_epoch = models.PositiveBigIntegerField(default=0, help_text="Fencing token.")
    event_seq = models.PositiveIntegerField(default=0)

    # The W3C trace context of the code that enqueued it (JSON of traceparent and
    # tracestate; "" without tracing): every attempt's span continues that trace.
    trace_context = models.TextField(blank=True, default="", db_default="", editable=False)

    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    # Not a column: set on the job ``durable.jobs.enqueue`` returns, False when an
    # unfinished job with the same unique key was returned instead of a new one.
    created: bool
    # Not a column either: set on a job ``durable.lease.claim`` returns, whether any unit
    # result of it exists (the worker then skips looking each one up).
    has_results: bool

    class Meta:
        # The dashboard's operator actions, grantable one by one (Django's own
        # add_job lets a user start jobs from the dashboard's "New job" page;
        # change_job implies all three of these).
        permissions = [
            ("pause_job", "Can pause and resume jobs"),
            ("cancel_job", "Can cancel jobs"),
            ("retry_job", "Can retry jobs now"),
            # Operations whose access is PRIVILEGED (restore, file moves, imports…).
            ("start_privileged_job", "Can start privileged operations"),
            # Whole queues (durable.queues): workers stop claiming from a paused one.
            ("pause_queue", "Can pause and resume queues"),
        ]
        indexes = [
            # The claim: WHERE state='queued' AND queue=? AND next_attempt_at<=?
            # ORDER BY priority DESC, next_attempt_at, id — an index range scan.
            models.Index(
                fields=["queue", "-priority", "next_attempt_at", "id"],
                name="durable_job_due",
                condition=Q(state="queued"),
            ),
            models.Index(
                fields=["lease_expires_at"],
                name="durable_job_lease",
                condition=Q(lease_owner__isnull=False),
            ),
            # "Jobs of this state, newest first" (ids grow with creation).
            models.Index(fields=["state", "-id"], name="durable_job_state_newest"),
            models.Index(fields=["operation", "-id"], name="durable_job_op_newest"),
            # Retention's "finished before", and (covering) the dashboard's throughput
            # over time and finished-per-queue: index-only at 100,000 jobs. Partial: every
            # query of it bounds finished_at, and an unfinished job (NULL) is one index
            # write less on enqueue — SQLite's enqueue writes each touched page whole.
            models.Index(
                fields=["finished_at", "state", "queue", "operation"],
                name="durable_job_finished",
                condition=Q(finished_at__isnull=False),
            ),
            # The Queues page: jobs per state and queue, due or not (index-only); and
            # the Jobs page filtered by queue. Written only when a job changes state.
            models.Index(
                fields=["state", "queue", "next_attempt_at"], name="durable_job_per_queue"
            ),
            models.Index(fields=["queue", "-id"], name="durable_job_queue_newest"),
        ]
        constraints = [
            # Jobs without a key (most) have no entry: NULLs never collide anyway, and
            # each would be one index write more on enqueue.
            models.UniqueConstraint(
                fields=["unique_key"],
                condition=Q(state__in=UNIQUE_KEY_STATES, unique_key__isnull=False),
                name="durable_job_unique_unfinished",
            ),
            models.CheckConstraint(
                condition=Q(state__in=JobState.values), name="durable_job_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                name="durable_job_priority",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.operation} #{self.pk} ({self.state})"

    @property
    def is_finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def progress(self) -> float | None:
        if not self.units_total:
            return None
        return min(self.units_done / self.units_total, 1.0)

    @property
    def last_error(self) -> dict | None:
        return self.errors[-1] if self.errors else None

    def lease_is_live(self, now: datetime | None = None) -> bool:
        """On this process's clock: fine for display; decisions use ``JobQuerySet.with_clock``."""
        return bool(
            self.lease_owner
            and self.lease_expires_at
            and self.lease_expires_at > (now or timezone.now())
        )


class JobEvent(models.Model):
    """The job's ordered log; ``seq`` runs 1, 2, 3… without gaps per job."""

    # No separate index on job_id: the (job, seq) unique index leads with it.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=40)
    message = models.TextField(blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "seq"]
        indexes = [
            # "Retried per minute/hour" on the dashboard's throughput chart: only retry
            # events are indexed, so the other events' writes pay nothing for it.
            models.Index(
                fields=["created_at", "job_id"],
                name="durable_jobevent_retries",
                condition=Q(kind="retry_scheduled"),
            ),
            # GET /metrics counts reclaims by when they happened (durable.metrics.totals):
            # rare, so a small index.
            models.Index(
                fields=["created_at", "job_id"],
                name="durable_jobevent_reclaimed_at",
                condition=Q(kind="reclaimed"),
            ),
        ]
        constraints = [
            models.UniqueConstraint(fields=["job", "seq"], name="durable_jobevent_seq_unique"),
        ]

    def __str__(self) -> str:
        return f"#{self.job_id}.{self.seq} {self.kind}"


class UnitResult(models.Model):
    """Evidence that a unit finished: step 2 of the unit order skips a unit found here."""

    # No separate index on job_id: the (job, key) unique index leads with it, and
    # one index less is one write less on every unit commit.
    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="unit_results", db_index=False
    )
    key = models.CharField(max_length=255)
    # Whatever the unit returned (JSON, null included): open, as the operation decides.
    result: Any = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "key"], name="durable_unitresult_key_unique"),
        ]

    def __str__(self) -> str:
        return f"#{self.job_id} {self.key}"
