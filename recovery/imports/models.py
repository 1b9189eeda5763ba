"""One ``ImportRecord`` per imported source file, identified by the SHA-256 of its bytes."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class ImportState(models.TextChoices):
    IMPORTING = "importing", "Importing"
    COMPLETED = "completed", "Completed"


class ImportRecord(models.Model):
    """The file's content is its identity: the same bytes imported again are recognised.

    Written by the import job's units only, in the transactions that advance
    its checkpoint. ``job_id`` is the job importing it (a plain number:
    retention may delete the job, never this record).
    """

    sha256 = models.CharField(max_length=64, unique=True)
    format = models.CharField(max_length=8)
    path = models.CharField(max_length=1024, help_text="Where it was read from (first import).")
    size = models.PositiveBigIntegerField()
    job_id = models.BigIntegerField()
    state = models.CharField(
        max_length=10, choices=ImportState.choices, default=ImportState.IMPORTING
    )
    records = models.PositiveBigIntegerField(default=0, help_text="Lines or rows read.")
    imported = models.PositiveBigIntegerField(default=0)
    duplicates = models.PositiveBigIntegerField(
        default=0, help_text="Rows already imported by an earlier, unfinished attempt."
    )
    skipped = models.JSONField(default=dict, blank=True, help_text="reason → count")
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.format} {self.sha256[:12]} ({self.state})"
