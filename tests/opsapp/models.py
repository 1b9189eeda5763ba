"""Models for the built-in database operations' tests, and a recorder of recovery events.

``Sample`` holds one column of every common field type (the values a backup,
a restore and a copy between vendors must carry unchanged), ``Tag`` a text
primary key (keyset batches on text), ``Node`` a nullable self-reference
(rows whose parent is in a later batch).

``RecordedEvent``: every ``recovery_event`` any process sends — the test
process or a worker subprocess — is stored here, so tests can count what was
announced across crashes.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models

from durable.signals import recovery_event


class Tag(models.Model):
    code = models.CharField(max_length=40, primary_key=True)
    title = models.CharField(max_length=100, blank=True, default="")

    def __str__(self) -> str:
        return self.code


class Sample(models.Model):
    name = models.CharField(max_length=100)
    text = models.TextField(blank=True, default="")
    count = models.IntegerField(null=True)
    big = models.BigIntegerField(default=0)
    ratio = models.FloatField(null=True)
    price = models.DecimalField(max_digits=12, decimal_places=2, null=True)
    flag = models.BooleanField(default=False)
    when = models.DateTimeField(null=True)
    day = models.DateField(null=True)
    at = models.TimeField(null=True)
    span = models.DurationField(null=True)
    uid = models.UUIDField(null=True)
    blob = models.BinaryField(null=True)
    data = models.JSONField(null=True)
    ip = models.GenericIPAddressField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    tags = models.ManyToManyField(Tag, blank=True)

    def __str__(self) -> str:
        return self.name


class Node(models.Model):
    name = models.CharField(max_length=100)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )

    def __str__(self) -> str:
        return self.name


class RecordedEvent(models.Model):
    type = models.CharField(max_length=100)
    severity = models.CharField(max_length=20)
    detail = models.TextField()
    db = models.CharField(max_length=255, blank=True, default="")
    done = models.BooleanField()
    deleted_data = models.BooleanField(default=False)
    job_id = models.BigIntegerField(null=True)
    object_ids = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.type} #{self.job_id}"


def record(sender: Any, **kwargs: Any) -> None:
    RecordedEvent.objects.create(
        type=kwargs["type"],
        severity=kwargs.get("severity", "info"),
        detail=kwargs.get("detail", ""),
        db=kwargs.get("db", ""),
        done=kwargs.get("done", True),
        deleted_data=kwargs.get("deleted_data", False),
        job_id=kwargs.get("job_id"),
        object_ids=kwargs.get("object_ids", []),
    )


recovery_event.connect(record, dispatch_uid="tests.opsapp.record")
