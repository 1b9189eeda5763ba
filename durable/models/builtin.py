"""Tables of the built-in operations.

- ``Announcement``: which recovery events a job has sent, so a unit that is
  repeated after a crash never announces the same fact twice.
- ``IntegrityScope`` and ``InventoryEntry``: what ``integrity.scan`` saw last
  time (the checksum inventory it compares against), and which scan is
  working on a scope now.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Announcement(models.Model):
    """Evidence that job ``job`` sent the recovery event ``key``; inserted with the send."""

    # No separate index on job_id: the (job, key) unique index leads with it.
    job = models.ForeignKey(
        "durable.Job", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    key = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "key"], name="durable_announcement_once"),
        ]

    def __str__(self) -> str:
        return f"#{self.job_id} {self.key}"


class IntegrityScope(models.Model):
    """One scanned thing ("storage:default", "database:default"): its lock and latest tallies.

    ``job_id`` is the scan holding the scope; another scan of the same scope
    waits until that job is finished. A plain id, not a foreign key: purging
    old jobs must not delete the scope's history.
    """

    scope = models.CharField(max_length=255, unique=True)
    job_id = models.BigIntegerField(null=True, blank=True)
    tallies = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.scope


class InventoryStatus(models.TextChoices):
    NEW = "new"  # first seen by the last scan
    OK = "ok"  # unchanged since the scan before
    MODIFIED = "modified"  # changed, and its modification time says it was written
    CORRUPTED = "corrupted"  # content changed, yet size and modification time did not


class InventoryEntry(models.Model):
    """One file of a scanned storage as the last scan found it."""

    scope = models.CharField(max_length=255)
    # The key can be long and non-ASCII; uniqueness and lookups use its SHA-256.
    key = models.TextField()
    key_hash = models.CharField(max_length=64)
    size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    mtime = models.FloatField(null=True, blank=True, help_text="Seconds since the epoch.")
    status = models.CharField(max_length=12, choices=InventoryStatus.choices)
    seen_by = models.BigIntegerField(help_text="The scan (job id) that last saw this file.")
    first_seen_at = models.DateTimeField(default=timezone.now)
    checked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["scope", "key_hash"], name="durable_inventory_key_unique"
            ),
        ]
        indexes = [models.Index(fields=["scope", "seen_by"], name="durable_inventory_seen")]
        verbose_name_plural = "inventory entries"

    def __str__(self) -> str:
        return f"{self.scope}:{self.key}"
