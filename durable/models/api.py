"""API clients (a token *hash*, never the token) and stored idempotent responses."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from ..states import FINISHED_STATES
from .jobs import Job

# Independent of each other: jobs:write does not imply jobs:read, nor jobs:admin either.
ADMIN_SCOPE = "jobs:admin"
METRICS_SCOPE = "metrics:read"  # GET /metrics (durable.metrics)
SCOPES = (
    "jobs:read",
    "jobs:write",
    ADMIN_SCOPE,
    "schedules:read",
    "schedules:write",
    METRICS_SCOPE,
)
SCOPE_HELP = {
    "jobs:read": "list and read jobs and their events",
    "jobs:write": "submit jobs; cancel, pause, resume, retry its own jobs",
    ADMIN_SCOPE: "with jobs:write or schedules:write: privileged operations, "
    "and actions on every client's jobs",
    "schedules:read": "list and read scheduled rules",
    "schedules:write": "create, enable, disable and delete scheduled rules",
    METRICS_SCOPE: "read GET /metrics (Prometheus)",
}


class Client(models.Model):
    """A program allowed to use the API: a name, its scopes and the hash of its token."""

    name = models.CharField(max_length=100, unique=True)
    scopes = models.JSONField(default=list, help_text="Any of: " + ", ".join(SCOPES))
    # Public part of the token ("dur_<prefix>_…"): finds the row by index.
    token_prefix = models.CharField(max_length=12, unique=True)
    token_hash = models.CharField(max_length=64, help_text="SHA-256 of the token, hex.")
    created_at = models.DateTimeField(default=timezone.now)
    rotated_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "durable_api_client"

    def __str__(self) -> str:
        return self.name

    def has_scope(self, scope: str) -> bool:
        return scope in (self.scopes or [])

    @property
    def actor(self) -> str:
        """How jobs and events name this client (owner, actor of an action)."""
        return f"api:{self.name}"


class IdempotencyKeyQuerySet(models.QuerySet):
    def purgeable(self, older_than) -> IdempotencyKeyQuerySet:
        """Old keys, except those of unfinished jobs: a client retrying a submission
        whose job still runs must get that job back, never a second one."""
        return self.filter(created_at__lt=older_than).filter(
            Q(job__isnull=True) | Q(job__state__in=FINISHED_STATES)
        )


class IdempotencyKey(models.Model):
    """The response to the first ``POST /jobs`` with this key, replayed for repeats.

    Written in the transaction that creates the job, so a key never exists
    without its job nor a job without its key; ``(client, key)`` is unique, and
    that constraint settles concurrent duplicates.
    """

    client = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=255)
    request_digest = models.CharField(
        max_length=64, help_text="SHA-256 of method, path and the normalised submission."
    )
    # NULL only inside the creating transaction, between the key and the job insert.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, null=True, related_name="+")
    response_status = models.PositiveSmallIntegerField(default=0)
    # The exact bytes sent the first time (a JSON column could reorder keys).
    response_body = models.TextField(blank=True, default="")
    response_headers = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects = IdempotencyKeyQuerySet.as_manager()

    class Meta:
        db_table = "durable_api_idempotency_key"
        constraints = [
            models.UniqueConstraint(fields=["client", "key"], name="durable_api_idem_unique"),
        ]
        indexes = [models.Index(fields=["created_at"], name="durable_api_idem_created")]

    def __str__(self) -> str:
        return f"{self.client_id}:{self.key}"
