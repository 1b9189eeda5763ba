"""Mail recipients and one mail delivery record per (event, recipient).

SMTP has no idempotency key, so a mail delivery is explicitly **at-least-once**:
the record is marked ``sending`` in its own commit before the message goes
out, and a replay that finds ``sending`` cannot know whether the server took
the message — it sends again and sets ``possibly_duplicate``, so the record
says "possibly sent twice" instead of hiding it. A record whose job is
cancelled or exhausted while it says ``sending`` keeps ``possibly_sent``.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from .webhooks import EventFilterMixin, OutboundEvent

AT_LEAST_ONCE = "at-least-once"


class MailRecipient(EventFilterMixin):
    name = models.CharField(max_length=100, unique=True)
    email = models.EmailField(max_length=254)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name


class MailState(models.TextChoices):
    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"  # committed before the SMTP conversation
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"
    EXHAUSTED = "exhausted", "Exhausted"
    CANCELLED = "cancelled", "Cancelled"


class MailDelivery(models.Model):
    event = models.ForeignKey(
        OutboundEvent, on_delete=models.PROTECT, related_name="mail_deliveries"
    )
    recipient = models.ForeignKey(
        MailRecipient, on_delete=models.PROTECT, related_name="deliveries"
    )
    address = models.EmailField(max_length=254, help_text="The address at the time of the event.")
    message_id = models.CharField(max_length=200, unique=True)
    guarantee = models.CharField(max_length=20, default=AT_LEAST_ONCE, editable=False)
    state = models.CharField(max_length=10, choices=MailState.choices, default=MailState.PENDING)
    possibly_duplicate = models.BooleanField(
        default=False,
        help_text="Stopped between sending and recording: possibly sent twice.",
    )
    possibly_sent = models.BooleanField(
        default=False,
        help_text="Cancelled or exhausted while sending: the message may have gone out.",
    )
    send_attempts = models.PositiveIntegerField(default=0, help_text="SMTP sends started.")
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="", help_text="Bounded and redacted.")
    job_id = models.BigIntegerField(null=True, blank=True)
    resends = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "mail deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["event", "recipient"], name="durable_maildelivery_once_per_recipient"
            ),
            models.CheckConstraint(
                condition=Q(state__in=MailState.values), name="durable_maildelivery_state_valid"
            ),
        ]
        indexes = [
            models.Index(fields=["state", "-id"], name="durable_maildelivery_state"),
            models.Index(fields=["job_id"], name="durable_maildelivery_job"),
        ]

    def __str__(self) -> str:
        return f"{self.event_id} → {self.address} ({self.state})"
