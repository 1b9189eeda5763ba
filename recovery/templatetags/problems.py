"""Template helpers of the Problems dashboard; the decisions behind them: recovery.dashboard."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html

from recovery.dashboard import formatting
from recovery.dashboard.query import TableQuery

register = template.Library()


@register.simple_tag(takes_context=True)
def query_url(context: template.Context, query: TableQuery, **changes: Any) -> str:
    """This page's path with ``query`` changed (``page=2``, ``status="failed"``…)."""
    params = query.params(**changes)
    path = context["request"].path
    return f"{path}?{params}" if params else path


@register.filter
def relative(moment: datetime | None, now: datetime) -> str:
    return formatting.relative_time(moment, now)


@register.filter
def excerpt(text: str | None, limit: int = 120) -> str:
    return formatting.excerpt(text, int(limit))


@register.filter
def number(value: int | None) -> str:
    return formatting.number(value)


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON for ``<pre>``; escaped by the template like any other text."""
    if value is None:
        return "—"
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


@register.simple_tag
def tally(row: Any) -> str:
    return formatting.actor_tally(
        row.users, row.users_overflow, row.addresses, row.addresses_overflow
    )


@register.inclusion_tag("problems/_progress.html")
def progress(job: Any) -> dict[str, Any]:
    return {
        "done": job.units_done,
        "total": job.units_total,
        "percent": formatting.percent(job.units_done, job.units_total),
    }


@register.inclusion_tag("problems/_page_link.html", takes_context=True)
def page_link(
    context: template.Context, query: TableQuery, page: int, text: str, rel: str, title: str
) -> dict[str, Any]:
    """A pager link that works as a plain link and, with htmx, swaps only the results."""
    return {"url": query_url(context, query, page=page), "text": text, "rel": rel, "title": title}


@register.simple_tag(takes_context=True)
def sort_link(context: template.Context, query: TableQuery, key: str, label: str) -> str:
    """A column header that sorts by ``key`` (``-key``: descending first); a second click
    reverses it. A plain link (a full page: the toolbar then shows the order too)."""
    current = query.get("sort")
    name = key.lstrip("-")
    if current.lstrip("-") == name:
        target = name if current.startswith("-") else f"-{name}"
        arrow = " ▼" if current.startswith("-") else " ▲"
        state = "descending" if current.startswith("-") else "ascending"
    else:
        target, arrow, state = key, "", ""
    url = query_url(context, query, sort=target)
    title = f"Sort by {label.lower()}" + (f" (now {state})" if state else "")
    return format_html(
        '<a class="sort" href="{}" title="{}"{}>{}{}</a>',
        url,
        title,
        format_html(' aria-current="true" data-sort="{}"', state) if state else "",
        label,
        arrow,
    )


@register.filter
def iso(moment: datetime | None) -> str:
    """``datetime`` attribute text: what ``|date:'c'`` gives, without its per-call cost
    (Django's date formatting, ~70 µs, adds up on a table of timestamps)."""
    return moment.isoformat() if moment else ""


@register.filter
def stamp(moment: datetime | None) -> str:
    """``Y-m-d H:i:s`` in the current time zone (UTC here), as a title shows it."""
    if not moment:
        return ""
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S")
