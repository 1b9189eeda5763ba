"""Admin views, read-mostly: these reports are history, written only by the app itself.

Administrators record a manual event with ``record_recovery_event`` (or the
dashboard's form); nobody edits or adds rows here. Security rows may be
deleted (a counter reset after an incident); recovery history may not. Text from files and
requests is escaped by the admin's templates; the few derived cells below
build their HTML with ``format_html`` for the same reason.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html

from .models import IngestCursor, IngestPath, RecoveryEvent, SecurityEvent


class ReadOnlyAdmin(admin.ModelAdmin):
    show_full_result_count = False  # no COUNT(*) over a million rows per page view

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(RecoveryEvent)
class RecoveryEventAdmin(ReadOnlyAdmin):
    list_display = ["recorded_at", "done_mark", "severity", "type", "source", "db", "short_detail",
                    "username", "ipv4", "ipv6", "job_id"]  # fmt: skip
    list_filter = ["severity", "done", "deleted_data", "source"]
    search_fields = ["type", "detail", "db"]
    ordering = ["-id"]  # newest first, served by the primary key

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # an audit history: retention, if ever, is a job, not a click

    @admin.display(description="Done")
    def done_mark(self, event: RecoveryEvent) -> str:
        mark = "✔" if event.is_done else "⚠"
        trash = " 🗑" if event.deleted_data and event.is_done else ""
        return format_html("<span title='{}'>{}{}</span>", event.done, mark, trash)

    @admin.display(description="Detail")
    def short_detail(self, event: RecoveryEvent) -> str:
        text = event.detail or event.reason
        return text if len(text) <= 120 else text[:119] + "…"


@admin.register(SecurityEvent)
class SecurityEventAdmin(ReadOnlyAdmin):
    list_display = ["last_seen", "count", "severity", "category", "key", "source", "cwe",
                    "actors", "last_ipv4", "last_ipv6", "first_seen"]  # fmt: skip
    list_filter = ["severity", "category", "stream"]
    search_fields = ["category", "key", "detail"]
    ordering = ["-last_seen", "-id"]

    @admin.display(description="Actors")
    def actors(self, row: SecurityEvent) -> str:
        tallies = sorted({**row.users, **row.addresses}.items(), key=lambda kv: -kv[1])[:3]
        shown = ", ".join(f"{name} {count:,}" for name, count in tallies)
        others = row.users_overflow + row.addresses_overflow
        return f"{shown}, and {others:,} others" if others else shown


@admin.register(IngestCursor)
class IngestCursorAdmin(ReadOnlyAdmin):
    list_display = ["path", "offset", "generation", "file_id", "tag", "lines_imported",
                    "lines_skipped", "updated_at"]  # fmt: skip

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # without it the next ingest reads the whole file again


@admin.register(IngestPath)
class IngestPathAdmin(ReadOnlyAdmin):
    list_display = ["path", "cursor", "seen", "updated_at"]

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # it tells the next ingest which file the name held: rotations


from .imports import admin as _imports_admin  # noqa: E402,F401 - registers its pages
