"""Import records in the admin site: read-only (written by the import jobs alone)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from .models import ImportRecord


@admin.register(ImportRecord)
class ImportRecordAdmin(admin.ModelAdmin):
    list_display = ["created_at", "format", "state", "path", "imported", "duplicates", "records",
                    "job_id", "finished_at"]  # fmt: skip
    list_filter = ["state", "format"]
    search_fields = ["=sha256", "path"]
    ordering = ["-id"]

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # deleting one would let the same file be imported twice
