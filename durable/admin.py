"""Read-only admin views: engine tables change only through the engine's API."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import admin
from django.db import models
from django.http import HttpRequest

from .models import (
    Credential,
    Delivery,
    Endpoint,
    GateSlot,
    Job,
    JobEvent,
    MailDelivery,
    MailRecipient,
    OutboundEvent,
    WorkerProcess,
)
from .notify import audit_actor, redeliver, resend_mail
from .schedules import admin as _schedules_admin  # noqa: F401 - registers its pages


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class JobEventInline(admin.TabularInline):
    model = JobEvent
    fields = ["seq", "kind", "message", "data", "created_at"]
    readonly_fields = ["seq", "kind", "message", "data", "created_at"]
    extra = 0
    can_delete = False
    ordering = ["-seq"]
    max_num = 0

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = ["id", "operation", "state", "units_done", "units_total", "attempts",
                    "next_attempt_at", "lease_owner", "created_at"]  # fmt: skip
    list_filter = ["state", "operation", "queue"]
    search_fields = ["=id", "operation", "owner"]
    ordering = ["-id"]
    inlines = [JobEventInline]
    show_full_result_count = False


@admin.register(WorkerProcess)
class WorkerProcessAdmin(ReadOnlyAdmin):
    list_display = ["worker_id", "hostname", "pid", "started_at", "heartbeat_at", "stopped_at"]
    ordering = ["-started_at"]


# --- outbound HTTP, webhooks, mail, credentials ------------------------------------
# Endpoints and mail recipients are configuration, edited here (they hold only a
# secret's *name*). Deliveries, events, gates and credentials are read-only;
# a credential's value or ciphertext is never shown.


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    list_display = ["name", "url", "event_filter", "provider", "enabled", "created_at"]
    list_filter = ["enabled", "provider"]
    search_fields = ["name", "url"]
    fields = ["name", "url", "event_filter", "secret_ref", "provider", "enabled"]
    # Django 6 assumes https for a URL typed without a scheme; say so now.
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}


@admin.register(MailRecipient)
class MailRecipientAdmin(admin.ModelAdmin):
    list_display = ["name", "email", "event_filter", "enabled", "created_at"]
    list_filter = ["enabled"]
    search_fields = ["name", "email"]
    fields = ["name", "email", "event_filter", "enabled"]


@admin.register(OutboundEvent)
class OutboundEventAdmin(ReadOnlyAdmin):
    list_display = ["id", "event_type", "event_id", "summary", "created_at"]
    list_filter = ["event_type"]
    search_fields = ["event_id", "event_type"]
    ordering = ["-id"]
    show_full_result_count = False


class SendAgainAdmin(ReadOnlyAdmin):
    """Read-only, with an admin action that sends deliveries again through their durable job.

    Whoever may retry jobs (``durable.retry_job``, or ``change_job``) may use it.
    Webhooks keep their ``Idempotency-Key`` and mail its ``Message-ID``, so a
    receiver that saw the first attempt can tell the repeat.
    """

    def has_send_again_permission(self, request: HttpRequest) -> bool:
        user = request.user
        return user.has_perm("durable.retry_job") or user.has_perm("durable.change_job")

    def _send_again(
        self, request: HttpRequest, queryset: models.QuerySet, how: Callable[..., Job]
    ) -> None:
        jobs = [
            how(pk, actor=audit_actor(request)).pk for pk in queryset.values_list("pk", flat=True)
        ]
        self.message_user(request, f"{len(jobs)} queued again (jobs {', '.join(map(str, jobs))}).")


@admin.register(Delivery)
class DeliveryAdmin(SendAgainAdmin):
    list_display = ["id", "event", "endpoint", "state", "possibly_sent", "status_code",
                    "attempts", "delivered_at", "job_id", "idempotency_key"]  # fmt: skip
    list_filter = ["state", "possibly_sent", "endpoint"]
    search_fields = ["=idempotency_key", "=job_id"]
    ordering = ["-id"]
    show_full_result_count = False
    actions = ["redeliver"]

    @admin.action(description="Deliver again (same Idempotency-Key)", permissions=["send_again"])
    def redeliver(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        self._send_again(request, queryset, redeliver)


@admin.register(MailDelivery)
class MailDeliveryAdmin(SendAgainAdmin):
    list_display = ["id", "event", "address", "state", "possibly_sent", "possibly_duplicate",
                    "guarantee", "send_attempts", "sent_at", "job_id"]  # fmt: skip
    list_filter = ["state", "possibly_sent", "possibly_duplicate"]
    search_fields = ["address", "=job_id"]
    ordering = ["-id"]
    show_full_result_count = False
    actions = ["resend"]

    @admin.action(description="Send again (same Message-ID)", permissions=["send_again"])
    def resend(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        self._send_again(request, queryset, resend_mail)


@admin.register(Credential)
class CredentialAdmin(ReadOnlyAdmin):
    list_display = ["name", "created_at", "updated_at"]
    fields = ["name", "created_at", "updated_at"]  # never the ciphertext
    search_fields = ["name"]
    ordering = ["name"]


@admin.register(GateSlot)
class GateSlotAdmin(ReadOnlyAdmin):
    list_display = ["provider", "holder", "acquired_at", "expires_at"]
    list_filter = ["provider"]
    ordering = ["-acquired_at"]
