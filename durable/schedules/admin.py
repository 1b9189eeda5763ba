"""Schedules in the admin site, read-only: change them with the commands (or the service API),
which validate the rule and keep ``next_run_at`` right."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from ..models.schedules import Occurrence, Schedule
from .service import describe_rule


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Schedule)
class ScheduleAdmin(_ReadOnly):
    list_display = ["name", "operation", "rule", "enabled", "managed", "catch_up", "next_run_at",
                    "last_run_at"]  # fmt: skip
    list_filter = ["enabled", "managed", "operation"]
    search_fields = ["name", "operation"]
    ordering = ["name"]

    @admin.display(description="Rule")
    def rule(self, schedule: Schedule) -> str:
        return describe_rule(schedule)


@admin.register(Occurrence)
class OccurrenceAdmin(_ReadOnly):
    list_display = ["scheduled_for", "schedule", "job_id", "missed", "note", "worker"]
    list_filter = ["schedule"]
    ordering = ["-id"]
    show_full_result_count = False
