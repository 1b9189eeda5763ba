"""Scheduled rules: a ``Schedule`` enqueues a job per occurrence; an ``Occurrence`` proves it did.

An occurrence is identified by (schedule, scheduled time). It is recorded, its
job enqueued and the schedule's ``next_run_at`` advanced in one transaction,
and the (schedule, scheduled_for) unique constraint refuses a second record,
so an occurrence is applied at most once however many workers tick and
however often they restart. Rows change only through ``durable.schedules.service``.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from ..rules import QUEUE_NAME_MAX
from ..schedules.timing import Rule


class ScheduleQuerySet(models.QuerySet):
    def due(self, now: datetime | object) -> ScheduleQuerySet:
        """Enabled and due: a range scan on the partial ``durable_schedule_due`` index."""
        return self.filter(enabled=True, next_run_at__lte=now)


class Schedule(models.Model):
    name = models.CharField(max_length=100, unique=True)
    operation = models.CharField(max_length=100)
    input = models.JSONField(default=dict, blank=True, help_text="Sanitized: never a secret.")
    cron = models.CharField(max_length=200, blank=True, default="", help_text="5-field cron.")
    interval = models.DurationField(null=True, blank=True, help_text="Or a fixed interval.")
    time_zone = models.CharField(
        max_length=64, blank=True, default="", help_text="For cron; empty: settings.TIME_ZONE."
    )
    catch_up = models.CharField(
        max_length=8,
        choices=[("latest", "latest"), ("skip", "skip")],  # timing.CatchUp
        default="latest",
        help_text="latest: run the latest missed occurrence once; skip: none.",
    )
    overlap = models.BooleanField(
        default=False, help_text="Enqueue even while the previous occurrence's job is unfinished."
    )
    queue = models.CharField(
        max_length=QUEUE_NAME_MAX, blank=True, default="", help_text="Empty: the operation's."
    )
    priority = models.SmallIntegerField(null=True, blank=True, help_text="Empty: the operation's.")
    enabled = models.BooleanField(default=True)
    managed = models.BooleanField(
        default=False, help_text="Created by the site from its settings (timing kept in sync)."
    )
    next_run_at = models.DateTimeField(null=True, blank=True, help_text="The next occurrence.")
    last_run_at = models.DateTimeField(null=True, blank=True, help_text="The last one applied.")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        indexes = [
            # Every worker asks "anything due?" on each heartbeat: an index range scan.
            models.Index(
                fields=["next_run_at"], name="durable_schedule_due", condition=Q(enabled=True)
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=(Q(cron="") & Q(interval__isnull=False))
                | (~Q(cron="") & Q(interval__isnull=True)),
                name="durable_schedule_cron_xor_interval",
            ),
            models.CheckConstraint(
                condition=Q(catch_up__in=["latest", "skip"]),
                name="durable_schedule_catch_up_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def zone(self) -> str:
        return self.time_zone or settings.TIME_ZONE or "UTC"

    @property
    def rule(self) -> Rule:
        return Rule(cron=self.cron, every=self.interval, zone=self.zone)


class Occurrence(models.Model):
    """One applied occurrence of a schedule; (schedule, scheduled_for) is its identity."""

    schedule = models.ForeignKey(
        Schedule, on_delete=models.CASCADE, related_name="occurrences", db_index=False
    )
    scheduled_for = models.DateTimeField()
    # A plain number, not a foreign key: retention deletes finished jobs, and the
    # record that the occurrence was applied must outlive them.
    job_id = models.BigIntegerField(null=True, blank=True)
    missed = models.PositiveIntegerField(
        default=0, help_text="Earlier due occurrences passed over by the catch-up policy."
    )
    note = models.CharField(max_length=255, blank=True, default="")
    worker = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # Leads with schedule_id, so it also serves "this schedule's occurrences".
            models.UniqueConstraint(
                fields=["schedule", "scheduled_for"], name="durable_occurrence_unique"
            ),
        ]
        indexes = [models.Index(fields=["created_at"], name="durable_occurrence_created")]

    def __str__(self) -> str:
        return f"{self.schedule_id}@{self.scheduled_for.isoformat()}"
