"""Reading one page of a table: totals, the page's rows, and the search — fast on a million rows.

- **Recovery, no search**: the total comes from ``DailyCount`` (plus, on
  SQLite, the tail of events the deferred counts have not reached yet, counted
  directly), the page from the primary key (or the Failed/Deleted partial
  index) read from the nearer end: the last page of a million rows is read in
  ascending order and reversed, never skipped to with a huge OFFSET.
- **Recovery, search of 3+ characters**: the trigram index (SQLite FTS5,
  PostgreSQL pg_trgm) finds the matches — on SQLite the tail beyond the index
  cursor is scanned and its matches come first (they are the newest); the
  count stops at ``SEARCH_LIMIT`` ("10,000+ matches") and paging reaches the
  newest ``SEARCH_LIMIT`` matches.
- **Recovery, shorter search**: no trigram to look up, so the newest
  ``RECENT_SCAN`` events are scanned and the page says so.
- **Recovery, search and a filter** on SQLite: the newest ``FILTERED_SCAN``
  matches of the text are filtered (the page says so when there are more);
  PostgreSQL combines both indexes and needs no bound.
- **Security** is small by design (one row per kind of refusal) and **Jobs**
  are counted directly (100,000 jobs count in milliseconds through the
  ``(state, -id)`` index); both page from the nearer end too.

Search is literal and case-insensitive on every path: the text reaches the
database only as a bound parameter (a LIKE pattern with its wildcards
escaped, or a quoted FTS5 phrase), never as SQL or a regular expression.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from django.db import connection
from django.db.models import BooleanField, Case, IntegerField, Q, QuerySet, Sum, When
from django.db.models.expressions import RawSQL

from durable.clientip import parse_address
from durable.models import Job, JobQuerySet
from durable.states import JobState
from recovery.models import DailyCount, RecoveryEvent, RecoveryEventQuerySet, SecurityEvent

from . import sql
from .query import (
    Filter,
    TableQuery,
    Window,
    fts5_phrase,
    like_contains,
    uses_index,
    window,
)

SEARCH_LIMIT = 10_000
RECENT_SCAN = 20_000
FILTERED_SCAN = 20_000  # SQLite: matches of a search looked at when a filter is set too

RECOVERY_STATUSES = ("all", "done", "failed", "deleted")
RECOVERY_FILTERS = (Filter("status", RECOVERY_STATUSES, "all"),)
SEVERITIES = ("all", "info", "warning", "error")
# ?sort=: the orders a user would sort by; each ends in a unique column, so pages are stable.
SECURITY_SORTS = {
    "-last": ("-last_seen", "-id"),  # the default, and an index
    "-count": ("-count", "-last_seen"),  # an index too
    "-first": ("-first_seen", "-id"),
    "first": ("first_seen", "id"),
}
SECURITY_FILTERS = (
    Filter("severity", SEVERITIES, "all"),
    Filter("sort", tuple(SECURITY_SORTS), "-last"),
)
JOB_STATES = ("all", "active", "retrying", *JobState.values)
JOB_FILTERS = (
    Filter("state", JOB_STATES, "all"),
    Filter("operation"),
    Filter("error"),
    Filter("queue"),
    Filter("sort", ("-created", "created", "-attempts", "attempts", "next", "-next"), "-created"),
)
JOB_SORTS = {  # "-created" (newest first) is read by id from either end: read_window
    "created": ("id",),
    "-attempts": ("-attempts", "-id"),
    "attempts": ("attempts", "-id"),
    "next": ("next_attempt_at", "-id"),
    "-next": ("-next_attempt_at", "-id"),
}


@dataclass
class Listing:
    rows: list[Any]
    window: Window
    note: str = ""

    @property
    def total_text(self) -> str:
        total = f"{self.window.total:,}"
        return f"{total}+" if self.window.bounded else total


def read_window(queryset: QuerySet, win: Window) -> list[Any]:
    """The page's rows, newest first, reading from whichever end is nearer.

    The rows skipped by the offset are read as ids only (an index-only scan
    where the database can), then just the page's rows are fetched whole.
    """
    if win.limit <= 0:
        return []
    ids = queryset.values_list("id", flat=True)
    if win.from_end:
        page = list(ids.order_by("id")[win.after : win.after + win.limit])[::-1]
    else:
        page = list(ids.order_by("-id")[win.offset : win.offset + win.limit])
    found = queryset.model.objects.in_bulk(page)
    return [found[pk] for pk in page if pk in found]


# --- Recovery -----------------------------------------------------------------------------


def recovery_status(queryset: RecoveryEventQuerySet, status: str) -> RecoveryEventQuerySet:
    if status == "done":
        return queryset.done()
    if status == "failed":
        return queryset.failed()
    if status == "deleted":
        return queryset.deleted()
    return queryset


def _tail_sql(upto: int, columns: str, group: str = "") -> tuple[str, list[Any]]:
    return f"SELECT {columns} FROM {_TABLE} WHERE id > %s{group}", [upto]


def recovery_totals() -> dict[str, int]:
    """Events per status, from the per-day counts (a few hundred rows, not a million)."""
    sums = DailyCount.objects.aggregate(
        all=Sum("events"),
        failed=Sum(Case(When(failed=True, then="events"), default=0, output_field=IntegerField())),
        deleted=Sum(
            Case(When(deleted=True, then="events"), default=0, output_field=IntegerField())
        ),
    )
    totals = {name: int(value or 0) for name, value in sums.items()}
    upto = sql.indexed_upto(connection)
    if upto is not None:  # SQLite: add the events the deferred counts have not reached
        query, params = _tail_sql(upto, "count(*), sum(done IS 0), sum(deleted_data = 1)")
        tail = _fetch_row(query, params)
        for name, value in zip(("all", "failed", "deleted"), tail, strict=True):
            totals[name] += int(value or 0)
    totals["done"] = totals["all"] - totals["failed"]
    return totals


def events_by_severity() -> dict[tuple[str, bool], int]:
    """Events per (severity, failed), from the per-day counts plus, on SQLite, the tail."""
    counts: dict[tuple[str, bool], int] = {}
    rows = DailyCount.objects.values_list("severity", "failed").annotate(n=Sum("events")).order_by()
    tail: list[tuple[str, Any, int]] = []
    upto = sql.indexed_upto(connection)
    if upto is not None:
        query, params = _tail_sql(upto, "severity, done IS 0, count(*)", " GROUP BY 1, 2")
        with connection.cursor() as cursor:
            cursor.execute(query, params)
            tail = cursor.fetchall()
    for severity, failed, n in [*rows, *tail]:
        key = (str(severity), bool(failed))
        counts[key] = counts.get(key, 0) + int(n or 0)
    return counts


def daily_counts(first: date, last: date) -> dict[date, tuple[int, int]]:
    """(events, failed events) per day in [first, last], tail included on SQLite."""
    counts: dict[date, tuple[int, int]] = {}

    def add(day: date, failed: bool, events: int) -> None:
        total, failing = counts.get(day, (0, 0))
        counts[day] = (total + events, failing + (events if failed else 0))

    rows = (
        DailyCount.objects.filter(day__gte=first, day__lte=last)
        .values("day", "failed")
        .annotate(n=Sum("events"))
        .order_by()
    )
    for row in rows:
        add(row["day"], row["failed"], row["n"])
    upto = sql.indexed_upto(connection)
    if upto is not None:
        query, params = _tail_sql(
            upto, f"{sql.SQLITE_DAY_OF_ROW}, done IS 0, count(*)", " GROUP BY 1, 2"
        )
        with connection.cursor() as cursor:
            cursor.execute(query, params)
            for day_text, failed, events in cursor.fetchall():
                day = date.fromisoformat(day_text)
                if first <= day <= last:
                    add(day, bool(failed), events)
    return counts


# Row conditions per status, as SQL over the events table aliased "e".
_SQL_STATUS = {
    "sqlite": {
        "all": "",
        "done": " AND e.done IS NOT 0",
        "failed": " AND e.done = 0",
        "deleted": " AND e.deleted_data = 1",
    },
    "postgresql": {
        "all": "",
        "done": " AND e.done IS NOT FALSE",
        "failed": " AND NOT e.done",
        "deleted": " AND e.deleted_data",
    },
}
_TABLE = RecoveryEvent._meta.db_table


def _like_any(operator: str) -> str:
    return " OR ".join(
        f"e.{column} {operator} %s ESCAPE '\\'" for column in ("type", "detail", "db")
    )


def _indexed_search_sql(status: str) -> tuple[str, str, str]:
    """(SQL of the matching ids, its ORDER BY newest first, its parameters' kind)
    for a search of 3+ characters.

    Kinds: ``phrase`` (one FTS5 phrase), ``phrase+scan`` (the phrase and
    ``FILTERED_SCAN``), ``pattern`` (three LIKE patterns).
    """
    condition = _SQL_STATUS[connection.vendor][status]
    if connection.vendor == "sqlite":
        # The FTS5 table yields rowids in descending order by itself, so a
        # LIMIT stops the scan early even for a word in half the rows.
        if not condition:
            return (
                "SELECT rowid FROM recovery_event_fts WHERE recovery_event_fts MATCH %s",
                "ORDER BY rowid DESC",
                "phrase",
            )
        # With a filter, a common word would be checked against the filter row
        # by row through all its matches: only its newest FILTERED_SCAN are.
        return (
            f"SELECT e.id FROM (SELECT rowid FROM recovery_event_fts "
            f"WHERE recovery_event_fts MATCH %s ORDER BY rowid DESC LIMIT %s) AS m "
            f"JOIN {_TABLE} e ON e.id = m.rowid WHERE 1 = 1{condition}",
            "ORDER BY e.id DESC",
            "phrase+scan",
        )
    # PostgreSQL combines the trigram indexes with the partial index of a
    # filter (a BitmapAnd), or walks the primary key for a very common word.
    return (
        f"SELECT e.id FROM {_TABLE} e WHERE ({_like_any('ILIKE')}){condition}",
        "ORDER BY e.id DESC",
        "pattern",
    )


def _params(kind: str, text: str) -> list[Any]:
    if kind == "phrase":
        return [fts5_phrase(text)]
    if kind == "phrase+scan":
        return [fts5_phrase(text), FILTERED_SCAN]
    return [like_contains(text)] * 3


def _fetch(query: str, params: Sequence[Any]) -> list[Any]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return [row[0] for row in cursor.fetchall()]


def _fetch_row(query: str, params: Sequence[Any]) -> tuple[Any, ...]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchone()


def _rows_by_id(ids: list[int]) -> list[RecoveryEvent]:
    found = RecoveryEvent.objects.in_bulk(ids)
    return [found[i] for i in ids if i in found]


def _tail_matches(query: TableQuery, status: str, upto: int) -> list[int]:
    """SQLite: matches among the events the index has not reached, newest first (all of them,
    up to the search cap: the tail is a few batches at most when the indexer keeps up)."""
    condition = _SQL_STATUS["sqlite"][status]
    return _fetch(
        f"SELECT e.id FROM {_TABLE} e WHERE e.id > %s AND ({_like_any('LIKE')}){condition} "
        "ORDER BY e.id DESC LIMIT %s",
        [upto, *[like_contains(query.q)] * 3, SEARCH_LIMIT + 1],
    )


def _indexed_search(query: TableQuery, status: str) -> Listing:
    sql_text, order, kind = _indexed_search_sql(status)
    params = _params(kind, query.q)
    upto = sql.indexed_upto(connection)
    tail = _tail_matches(query, status, upto) if upto is not None else []
    # Counting needs no order: each database finds the cheapest way to stop at the cap.
    room = max(SEARCH_LIMIT + 1 - len(tail), 0)
    indexed = (
        _fetch(f"SELECT count(*) FROM ({sql_text} LIMIT %s) AS m", [*params, room])[0]
        if room
        else 0
    )
    counted = len(tail) + indexed
    bounded = counted > SEARCH_LIMIT
    win = window(query.page, query.per_page, min(counted, SEARCH_LIMIT), bounded=bounded)
    # The tail's matches are newer than every indexed one: they come first.
    ids = tail[win.offset : win.offset + win.limit]
    limit, offset = win.limit - len(ids), max(win.offset - len(tail), 0)
    if connection.vendor == "postgresql" and not bounded:
        # At most SEARCH_LIMIT matches, known now: collect them all through the
        # trigram indexes and sort them. With "ORDER BY id DESC LIMIT 5" alone the
        # planner may hope to meet the 5 early walking the primary key, and read
        # all of a million rows to find a rare word's 5 matches.
        page_sql = f"WITH m AS MATERIALIZED ({sql_text}) SELECT id FROM m ORDER BY id DESC"
    else:
        page_sql = f"{sql_text} {order}"
    if limit > 0:
        ids += _fetch(f"{page_sql} LIMIT %s OFFSET %s", [*params, limit, offset])
    note = (
        f"More than {SEARCH_LIMIT:,} matches: the newest {SEARCH_LIMIT:,} can be paged. "
        "Add words to narrow the search."
        if bounded
        else ""
    )
    if kind == "phrase+scan" and _scan_was_cut(query.q):
        note = (
            f"The text matches more than {FILTERED_SCAN:,} events: with a filter, the newest "
            f"{FILTERED_SCAN:,} of them are looked at. {note}"
        ).strip()
    return Listing(_rows_by_id(ids), win, note)


def _scan_was_cut(text: str) -> bool:
    counted = _fetch(
        "SELECT count(*) FROM (SELECT rowid FROM recovery_event_fts "
        "WHERE recovery_event_fts MATCH %s LIMIT %s) AS m",
        [fts5_phrase(text), FILTERED_SCAN + 1],
    )[0]
    return counted > FILTERED_SCAN


def _recent_scan(text: str, status: str) -> tuple[int | None, str, list[Any]]:
    floor = (
        RecoveryEvent.objects.order_by("-id")
        .values_list("id", flat=True)[RECENT_SCAN - 1 : RECENT_SCAN]
        .first()
    )
    operator = "ILIKE" if connection.vendor == "postgresql" else "LIKE"
    condition = _SQL_STATUS[connection.vendor][status]
    scan = (
        f"SELECT e.id FROM {_TABLE} e WHERE e.id >= %s AND ({_like_any(operator)}){condition} "
        "ORDER BY e.id DESC"
    )
    return floor, scan, [floor or 0, *[like_contains(text)] * 3]


def _recent_search(query: TableQuery, status: str) -> Listing:
    """Searches under three characters: the newest ``RECENT_SCAN`` events, scanned."""
    floor, scan, params = _recent_scan(query.q, status)
    counted = _fetch(f"SELECT count(*) FROM ({scan}) AS m", params)[0]
    win = window(query.page, query.per_page, counted)
    ids = (
        _fetch(f"{scan} LIMIT %s OFFSET %s", [*params, win.limit, win.offset]) if win.limit else []
    )
    note = (
        f"Searches shorter than 3 characters look at the latest {RECENT_SCAN:,} events only."
        if floor is not None
        else ""
    )
    return Listing(_rows_by_id(ids), win, note)


# Exactly as the partial index ``recovery_event_severe`` states its condition:
# SQLite uses a partial index only when the query repeats it literally
# (``severity IN (?, ?)`` with bound parameters never matches).
_SEVERE = RawSQL(
    "\"recovery_recoveryevent\".\"severity\" IN ('warning', 'error')",
    [],
    output_field=BooleanField(),
)


def severe_events() -> RecoveryEventQuerySet:
    """Warnings and errors, servable by their partial index."""
    return RecoveryEvent.objects.filter(_SEVERE)


def recent_problems(limit: int) -> list[RecoveryEvent]:
    """``RecoveryEvent.objects.problems().newest_first()[:limit]``, from two partial indexes.

    "Failed or warning or error" as one condition matches no single index, so
    on a million mostly-fine events it would scan; the newest ``limit`` of
    each part, merged, are the same rows.
    """
    failed = list(RecoveryEvent.objects.failed().newest_first()[:limit])
    severe = list(severe_events().newest_first()[:limit])
    merged = {event.pk: event for event in (*failed, *severe)}
    return sorted(merged.values(), key=lambda event: event.pk, reverse=True)[:limit]


def who_sql(text: str, status: str) -> tuple[str, list[Any]]:
    """Events by ``text`` as a user name or user id (exactly) or an address, newest first.

    Each term repeats its partial index's condition (SQLite uses a partial index only
    when the query states its condition), so this is a few index range scans.
    """
    terms = ["(e.username = %s AND e.username > '')", "(e.user_id = %s AND e.user_id > '')"]
    params: list[Any] = [text, text]
    address = parse_address(text)
    if address is not None:
        terms.append(f"e.ipv{address.version} = %s")
        params.append(str(address))
    condition = _SQL_STATUS[connection.vendor][status]
    return (
        f"SELECT e.id FROM {_TABLE} e WHERE ({' OR '.join(terms)}){condition} "
        "ORDER BY e.id DESC LIMIT %s",
        [*params, SEARCH_LIMIT + 1],
    )


def _with_who(listing: Listing, query: TableQuery, status: str) -> Listing:
    """The text search's rows plus the events whose actor or address is the text.

    Most searches match nobody by name or address: one cheap query, and the text
    search's own page stands. Otherwise both id lists (each at most SEARCH_LIMIT) are
    merged newest first and paged together.
    """
    who = _fetch(*who_sql(query.q, status))
    if not who:
        return listing
    if uses_index(query.q):
        sql_text, _, kind = _indexed_search_sql(status)
        upto = sql.indexed_upto(connection)
        text_ids = _tail_matches(query, status, upto) if upto is not None else []
        text_ids += _fetch(f"{sql_text} LIMIT %s", [*_params(kind, query.q), SEARCH_LIMIT + 1])
    else:
        _, scan, params = _recent_scan(query.q, status)
        text_ids = _fetch(f"{scan} LIMIT %s", [*params, SEARCH_LIMIT + 1])
    merged = sorted(set(text_ids) | set(who), reverse=True)
    bounded = len(merged) > SEARCH_LIMIT
    win = window(query.page, query.per_page, min(len(merged), SEARCH_LIMIT), bounded=bounded)
    ids = merged[win.offset : win.offset + win.limit]
    return Listing(_rows_by_id(ids), win, listing.note)


def recovery_listing(query: TableQuery) -> Listing:
    status = query.get("status") or "all"
    if query.q:
        if uses_index(query.q):
            return _with_who(_indexed_search(query, status), query, status)
        return _with_who(_recent_search(query, status), query, status)
    total = recovery_totals()[status]
    win = window(query.page, query.per_page, total)
    return Listing(read_window(recovery_status(RecoveryEvent.objects.all(), status), win), win)


# --- Security -----------------------------------------------------------------------------


def security_listing(query: TableQuery) -> Listing:
    rows = SecurityEvent.objects.all()
    severity = query.get("severity")
    if severity and severity != "all":
        rows = rows.filter(severity=severity)
    if query.q:
        rows = rows.filter(
            Q(category__icontains=query.q)
            | Q(key__icontains=query.q)
            | Q(source__icontains=query.q)
            | Q(cwe__icontains=query.q)
            | Q(detail__icontains=query.q)
        )
    win = window(query.page, query.per_page, rows.count())
    order = SECURITY_SORTS.get(query.get("sort"), SECURITY_SORTS["-last"])
    page = list(rows.order_by(*order)[win.offset : win.offset + win.limit]) if win.limit else []
    return Listing(page, win)


# --- Jobs ---------------------------------------------------------------------------------


def job_filter(queryset: JobQuerySet, spec: dict[str, str], now: datetime) -> JobQuerySet:
    """Jobs matching a Jobs-page filter: ``state``, ``operation``, ``error``, ``q``.

    Shared by the list, the bulk-action confirmation and the bulk-action job,
    so "everything matching the current filter" means the same everywhere.
    ``q`` is a job id (``42`` or ``#42``) or a literal piece of the operation
    name, the owner, the lease owner (the worker holding it: ``host:pid:…``), the
    last error's class or the reason it stopped (for a failed job, its error message).
    """
    state = spec.get("state") or "all"
    if state == "active":
        queryset = queryset.active()
    elif state == "retrying":
        queryset = queryset.retrying(now)
    elif state in JobState.values:
        queryset = queryset.filter(state=state)
    if spec.get("operation"):
        queryset = queryset.filter(operation=spec["operation"])
    if spec.get("error"):
        queryset = queryset.filter(last_error_class=spec["error"])
    if spec.get("queue"):
        queryset = queryset.filter(queue=spec["queue"])
    text = (spec.get("q") or "").strip()
    if text:
        condition = (
            Q(operation__icontains=text) | Q(owner__icontains=text) | Q(lease_owner__icontains=text)
        )
        digits = text.removeprefix("#")
        if digits.isascii() and digits.isdigit() and len(digits) <= 18:
            condition |= Q(pk=int(digits))  # a number is a job id, not a piece of a message
        else:
            # the error: its class and the reason it stopped (a failed job's message). Not
            # the ``errors`` JSON as text: "[" or "message" would match every job with one.
            condition |= Q(last_error_class__icontains=text) | Q(reason__icontains=text)
        queryset = queryset.filter(condition)
    return queryset


def job_spec(query: TableQuery) -> dict[str, str]:
    """Which jobs (the order is the page's business, not the filter's)."""
    return {"q": query.q, **{k: v for k, v in query.filters if k != "sort"}}


def jobs_listing(query: TableQuery, now: datetime) -> Listing:
    rows = job_filter(Job.objects.all(), job_spec(query), now)
    win = window(query.page, query.per_page, rows.count())
    order = JOB_SORTS.get(query.get("sort"))
    if order is None:
        return Listing(read_window(rows, win), win)
    page = list(rows.order_by(*order)[win.offset : win.offset + win.limit]) if win.limit else []
    return Listing(page, win)
