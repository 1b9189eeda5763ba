"""Per-provider gates shared by all workers on all machines: a row per provider, one per slot.

Changed only by ``durable.http.gates``; the admin shows them read-only.
"""

from __future__ import annotations

from django.db import models


class ProviderGate(models.Model):
    """Serialises gate decisions for one provider and remembers the last request start."""

    provider = models.CharField(max_length=100, unique=True)
    last_start_at = models.DateTimeField(null=True, blank=True)
    # Requests this gate turned away, and the seconds it told their jobs to wait: for
    # GET /metrics (durable_http_gate_waits). Counted under the row lock the decision
    # already holds, so counting costs no lock and no row of its own.
    waits_in_flight = models.PositiveBigIntegerField(db_default=0)
    waits_spacing = models.PositiveBigIntegerField(db_default=0)
    wait_seconds = models.FloatField(db_default=0.0)

    def __str__(self) -> str:
        return self.provider


class GateSlot(models.Model):
    """One request in flight to ``provider``.

    Released when the request ends; a slot whose worker died is ignored (and
    deleted) once ``expires_at`` passes. The expiry is the provider's total
    timeout plus a margin, and the client's whole exchange can never outlast
    its total timeout, so an expired slot's request is certainly over.
    """

    provider = models.CharField(max_length=100)
    holder = models.CharField(max_length=255, blank=True, default="")
    acquired_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["provider", "expires_at"], name="durable_gateslot_live")]

    def __str__(self) -> str:
        return f"{self.provider} {self.holder}"
