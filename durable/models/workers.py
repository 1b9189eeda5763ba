"""The worker registry, and the queues workers do not claim from.

``WorkerProcess`` tells a cold start (no live peer) from a joining worker and
keeps how each worker ended; ``PausedQueue`` is one condition of the claim.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import models
from django.utils import timezone

from ..rules import QUEUE_NAME_MAX


class WorkerProcessQuerySet(models.QuerySet):
    def not_stopped(self, now: datetime, within: timedelta) -> WorkerProcessQuerySet:
        """Not known to have exited, and heard from within ``within``: liveness candidates.

        Whether one is alive depends on its own ``lease_seconds``
        (``durable.policy.worker_alive``); ``within`` only bounds the rows read.
        """
        return self.filter(stopped_at__isnull=True, heartbeat_at__gte=now - within)


class WorkerProcess(models.Model):
    """One ``runworker`` process; tells a cold start (no live peer) from a joining worker."""

    worker_id = models.CharField(max_length=200, unique=True)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    host_key = models.CharField(max_length=100, blank=True, default="")
    queues = models.JSONField(default=list)
    concurrency = models.PositiveSmallIntegerField(default=1)
    # Its heartbeat comes every third of this; liveness is judged against it.
    # db_default: during a rolling deploy, workers of the previous release
    # still register without it.
    lease_seconds = models.FloatField(default=30.0, db_default=30.0)
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)
    # How it ended, for the operators' Workers page: "" while running (or until a peer
    # finds it gone), EXIT_CLEAN, EXIT_LOST or EXIT_UNIT_TIMEOUT (``durable.worker``'s exit 70).
    exit_reason = models.CharField(max_length=16, blank=True, default="", db_default="")

    objects = WorkerProcessQuerySet.as_manager()

    EXIT_CLEAN = "clean"  # stopped itself after draining (SIGTERM, --burst, Ctrl-C)
    EXIT_LOST = "lost"  # found gone by a peer: killed, crashed, or its machine went away
    EXIT_UNIT_TIMEOUT = "unit-timeout"  # left with exit status 70: a unit overran its timeout

    class Meta:
        indexes = [models.Index(fields=["heartbeat_at"], name="durable_worker_heartbeat")]

    def __str__(self) -> str:
        return self.worker_id


class PausedQueue(models.Model):
    """A queue workers do not claim from while this row exists (``durable.queues``).

    One small table read by one condition of the claim (``durable.lease.pick_sql``):
    pausing a queue costs no query per claim, and running jobs are not touched — they
    finish their unit and go on (a pause of the queue is not a pause of its jobs).
    """

    queue = models.CharField(max_length=QUEUE_NAME_MAX, unique=True)
    paused_at = models.DateTimeField(default=timezone.now)
    paused_by = models.CharField(max_length=150, blank=True, default="")
    reason = models.CharField(max_length=500, blank=True, default="")

    def __str__(self) -> str:
        return self.queue
