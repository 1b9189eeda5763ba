"""Outbound events, webhook endpoints and one delivery record per (event, endpoint).

``OutboundEvent`` is what ``durable.notify.publish`` was told; the fan-out
creates a ``Delivery`` for every enabled endpoint whose filter matches (and a
``durable.models.mail.MailDelivery`` for every matching mail recipient), each
with its own durable job. Deliveries are changed only by the delivery
operation and ``durable.notify``; the admin shows them read-only.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from ..sanitize import REFERENCE_NAME
from ..webhooks.policy import matches as filter_matches


def validate_event_filter(value: object) -> None:
    if not isinstance(value, list) or not all(isinstance(p, str) and p.strip() for p in value):
        raise ValidationError('a list of event type patterns, e.g. ["job.*", "recovery.*"]')
    if len(value) > 50:
        raise ValidationError("at most 50 patterns")


def validate_reference(value: str) -> None:
    if not REFERENCE_NAME.match(value or ""):
        raise ValidationError(
            "a credential name (letters, digits, _ . : -), not the secret itself; store the "
            "secret with `python manage.py credential set NAME`"
        )


class OutboundEvent(models.Model):
    event_type = models.CharField(max_length=100)
    event_id = models.CharField(max_length=200, unique=True)
    summary = models.CharField(max_length=300, blank=True, default="")
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["event_type", "-id"], name="durable_outevent_type")]

    def __str__(self) -> str:
        return f"{self.event_type} {self.event_id}"


class EventFilterMixin(models.Model):
    event_filter = models.JSONField(
        default=list,
        blank=True,
        validators=[validate_event_filter],
        help_text='Patterns such as ["job.*", "recovery.*"]; empty: all events.',
    )
    enabled = models.BooleanField(default=True)

    class Meta:
        abstract = True

    def matches(self, event_type: str) -> bool:
        return self.enabled and filter_matches(self.event_filter, event_type)


class Endpoint(EventFilterMixin):
    name = models.CharField(max_length=100, unique=True)
    url = models.URLField(max_length=2000, validators=[URLValidator(schemes=["http", "https"])])
    secret_ref = models.CharField(
        max_length=100,
        validators=[validate_reference],
        help_text="Credential name of the signing secret (never the secret).",
    )
    provider = models.CharField(
        max_length=100,
        default="webhooks",
        help_text="DURABLE_HTTP_PROVIDERS entry whose limits apply.",
    )
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"  # a non-retryable answer; the reason says which
    EXHAUSTED = "exhausted", "Exhausted"  # attempt limit reached; the job stays visible
    CANCELLED = "cancelled", "Cancelled"  # an operator cancelled its job


class Delivery(models.Model):
    event = models.ForeignKey(
        OutboundEvent, on_delete=models.PROTECT, related_name="webhook_deliveries"
    )
    endpoint = models.ForeignKey(Endpoint, on_delete=models.PROTECT, related_name="deliveries")
    idempotency_key = models.CharField(max_length=64, unique=True)
    state = models.CharField(
        max_length=10, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0, help_text="Requests actually sent.")
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="", help_text="Bounded and redacted.")
    # Set before the first POST and kept unless an answer (or a failure that surely sent
    # nothing) says otherwise: a worker killed after posting, or a timeout after the body
    # went out, leaves it. On a delivered record: possibly delivered twice (same key).
    possibly_sent = models.BooleanField(
        default=False, help_text="A POST may have reached the receiver with no answer recorded."
    )
    # A plain id, not a foreign key: retention may purge the finished job, the record stays.
    job_id = models.BigIntegerField(null=True, blank=True)
    redeliveries = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["event", "endpoint"], name="durable_delivery_once_per_endpoint"
            ),
            models.CheckConstraint(
                condition=Q(state__in=DeliveryState.values), name="durable_delivery_state_valid"
            ),
        ]
        indexes = [
            models.Index(fields=["state", "-id"], name="durable_delivery_state"),
            models.Index(fields=["job_id"], name="durable_delivery_job"),
        ]

    def __str__(self) -> str:
        return f"{self.event_id} → {self.endpoint_id} ({self.state})"
