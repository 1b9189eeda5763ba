"""The template context several dashboard pages share.

Every page gets ``page_context`` (the navigation and what this user may do);
Summary and Queues both show the throughput chart (``throughput_context``).
Below every view module, so views never import one another for it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.http import HttpRequest
from django.utils import timezone

from durable.rules import QUEUE_NAME_MAX

from . import rollup
from . import throughput as tp
from .access import (
    allowed_actions,
    can_add,
    can_change_schedules,
    can_record,
    visible_areas,
)
from .query import PER_PAGE_MAX, clean_query, parse_choice

PER_PAGE_CHOICES = (10, 25, 50, PER_PAGE_MAX)


def page_context(request: HttpRequest, section: str, **extra: Any) -> dict[str, Any]:
    """What the layout needs on every page: the section, the menus this user sees."""
    user = request.user
    return {
        "section": section,
        "now": timezone.now(),
        "may_view": visible_areas(user),
        "may_add": can_add(user),
        "may_record": can_record(user),
        "may_add_schedule": can_change_schedules(user, "add"),
        "allowed": allowed_actions(user),
        "per_page_choices": PER_PAGE_CHOICES,
        **extra,
    }


def throughput_context(request: HttpRequest, now: datetime) -> dict[str, Any]:
    """The chart and its controls, from ``?range=&queue=&operation=`` (forgiving)."""
    range_name = parse_choice(request.GET.get("range"), tuple(tp.RANGES), "hour")
    queue = clean_query(request.GET.get("queue"), QUEUE_NAME_MAX)
    operation = clean_query(request.GET.get("operation"), 100)
    start = tp.first_slot(now, range_name)
    if tp.RANGES[range_name][0] >= timedelta(hours=1):
        # Hourly slots over a day or a week: settled hours from the durable rollup
        # (counted once, the first time a chart needs them), the newest live.
        counts = rollup.hourly_counts(start, now, range_name, queue=queue, operation=operation)
    else:
        counts = rollup.live_counts(start, range_name, queue=queue, operation=operation)
    return {
        "throughput": tp.throughput(tp.series(counts, now, range_name), range_name),
        "tp_range": range_name,
        "tp_ranges": [(name, label) for name, (_, _, label) in tp.RANGES.items()],
        "tp_queue": queue,
        "tp_operation": operation,
    }
