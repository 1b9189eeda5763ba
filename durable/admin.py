"""Read-only admin views: engine tables change only through the engine's API."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from .models import Job, JobEvent, WorkerProcess


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
    readonly_fields = fields
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


from .schedules import admin as _schedules_admin  # noqa: E402,F401 - registers its pages
