"""Recovery search is a literal, case-insensitive substring on both databases and on both
paths (trigram index for 3+ characters, a bounded scan below), served by real indexes."""

from __future__ import annotations

import re
from datetime import UTC
from html import unescape

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from recovery.dashboard import listing, sql
from recovery.dashboard.listing import recovery_listing
from recovery.dashboard.query import parse_table_query
from recovery.models import DailyCount, RecoveryEvent
from recovery.parsing import parse_line
from recovery.policy import line_prefix
from recovery.records import record_event
from recovery.records.lines import insert_lines

pytestmark = pytest.mark.django_db

# Texts where a regex, LIKE wildcard or FTS5 syntax reading would find something else.
CORPUS = [
    "a.c", "abc", "a*c", "aac", "100%", "1000", "a_b", "axb", "C:\\tmp", "C:tmp", "x+y", "xy",
    "x$y", "(group)", "group", "[set]", "set", "{1,2}", "1,2", "a|b", "ab", "^start", "start",
    "end$", "end", 'say "hi"', "say hi", "back\\slash", "backslash", "BACKUP ok", "backup",
    "Backup-Created", "percent%sign", "under_score", "a OR b", "NEAR(x)", "x*", "-neg", "é",
    "a?c", "really?", "realy",
]  # fmt: skip
QUERIES = [
    ".", ".*", "a.c", "a*c", "%", "_", "100%", "a_b", "\\", "C:\\", "C:\\tmp", "+", "x+y", "$",
    "x$y", "^", "^start", "(group)", "(", ")", "[set]", "[]", "{1,2}", "{", "|", "a|b", '"',
    'say "hi"', "\\slash", "BACKUP", "backup-created", "nt%s", "r_s", "a OR b", "NEAR(x)",
    "x*", "-neg", "abc", "*", "é", "?", "a?c", "really?", "ly?",
]  # fmt: skip


@pytest.fixture
def corpus():
    ids = {}
    for n, text in enumerate(CORPUS):
        # Spread over the three searched columns; "source" is not searched.
        column = ("detail", "type", "db")[n % 3]
        fields = {"detail": "", "db": "", "source": "nowhere"}
        type_ = "t"
        if column == "type":
            type_ = text
        else:
            fields[column] = text
        ids[record_event(type_, **fields).pk] = text
    record_event("unrelated", detail="zzz", source="backup")  # source is not searched
    return ids


def search(q: str, status: str = "all", per_page: int = 100) -> list[int]:
    query = parse_table_query({"q": q, "status": status, "per_page": str(per_page)},
                              listing.RECOVERY_FILTERS)  # fmt: skip
    return [event.pk for event in recovery_listing(query).rows]


@pytest.mark.parametrize("q", QUERIES)
def test_search__is_the_literal_case_insensitive_substring(corpus, q):
    expected = sorted(
        (pk for pk, text in corpus.items() if q.lower() in text.lower()), reverse=True
    )
    assert search(q) == expected


def test_search__both_paths_are_taken(corpus, monkeypatch):
    assert listing.uses_index("abc")
    assert not listing.uses_index("ab")
    taken = []
    for name in ("_indexed_search", "_recent_search"):
        original = getattr(listing, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            taken.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(listing, name, spy)
    search("abc")
    search("ab")
    assert taken == ["_indexed_search", "_recent_search"]


def test_search__through_the_page_with_a_filter(client_for):
    record_event("corruption-detected", detail="wekan.sqlite is broken", done=False)
    record_event("integrity-ok", detail="WEKAN.sqlite is fine")
    record_event("backup-created", db="wekan")
    admin = client_for("admin")
    html = admin.get(reverse("problems:recovery"), {"q": "Wekan.SQLite"}).content.decode()
    assert "<strong>2</strong> events matching “Wekan.SQLite”" in html
    failed = admin.get(reverse("problems:recovery"), {"q": "wekan", "status": "failed"})
    assert "<strong>1</strong> event matching" in failed.content.decode()
    nothing = admin.get(reverse("problems:recovery"), {"q": "nothing-like-this"})
    assert "No events match “nothing-like-this”" in nothing.content.decode()


def test_search__pages_are_disjoint_and_complete():
    made = [record_event("t", detail=f"needle {n}").pk for n in range(23)]
    record_event("t", detail="other")
    seen = []
    for page in (1, 2, 3):
        query = parse_table_query({"q": "needle", "page": str(page)}, listing.RECOVERY_FILTERS)
        result = recovery_listing(query)
        assert result.window.total == 23
        seen += [event.pk for event in result.rows]
    assert seen == sorted(made, reverse=True)


def test_search__counts_stop_at_the_limit_and_say_so(monkeypatch, client_for):
    monkeypatch.setattr(listing, "SEARCH_LIMIT", 5)
    for n in range(8):
        record_event("t", detail=f"common {n}")
    query = parse_table_query({"q": "common", "per_page": "2", "page": "99"},
                              listing.RECOVERY_FILTERS)  # fmt: skip
    result = recovery_listing(query)
    assert result.window.bounded
    assert result.total_text == "5+"
    assert result.window.number == 3  # the newest 5 matches can be paged
    assert [e.detail for e in result.rows] == ["common 3"]
    html = client_for("admin").get(reverse("problems:recovery"), {"q": "common"}).content.decode()
    assert "<strong>5+</strong> events" in html
    assert "More than 5 matches" in html
    assert "page 1 / 1+" in html


def test_search__short_queries_scan_only_the_latest_events(monkeypatch):
    monkeypatch.setattr(listing, "RECENT_SCAN", 5)
    for n in range(8):
        record_event("t", detail=f"zz {n}")
    query = parse_table_query({"q": "zz"}, listing.RECOVERY_FILTERS)
    result = recovery_listing(query)
    assert [e.detail for e in result.rows] == ["zz 7", "zz 6", "zz 5", "zz 4", "zz 3"]
    assert "latest 5 events" in result.note


def test_search__with_a_filter_looks_at_the_newest_matches_on_sqlite(monkeypatch):
    monkeypatch.setattr(listing, "FILTERED_SCAN", 3)
    old = record_event("t", detail="needle old", done=False)
    for n in range(3):
        record_event("t", detail=f"needle {n}")
    new = record_event("t", detail="needle new", done=False)
    sql.catch_up(connection)  # the bound is the index's: events in the tail are all scanned
    query = parse_table_query({"q": "needle", "status": "failed"}, listing.RECOVERY_FILTERS)
    result = recovery_listing(query)
    if connection.vendor == "sqlite":
        assert [e.pk for e in result.rows] == [new.pk]  # "needle old" is the 5th match
        assert "the newest 3 of them are looked at" in result.note
    else:  # both indexes combined: no bound
        assert [e.pk for e in result.rows] == [new.pk, old.pk]
        assert result.note == ""


def test_search__index_follows_updates_and_deletes():
    event = record_event("t", detail="before-edit")
    sql.catch_up(connection)  # indexed: from here on the triggers must keep the index true
    assert search("before-edit") == [event.pk]
    RecoveryEvent.objects.filter(pk=event.pk).update(detail="after-edit")
    assert search("before-edit") == []
    assert search("after-edit") == [event.pk]
    RecoveryEvent.objects.filter(pk=event.pk).delete()
    assert search("after-edit") == []


def test_search__finds_lines_from_the_ingest_bulk_path():
    lines = [
        parse_line(b'{"type": "backup-created", "detail": "bulk-imported needle", "ts": ""}'),
        parse_line(b'{"type": "restore-backup", "db": "NEEDLE-db", "done": false}'),
    ]
    batch = [(n * 100, n, line) for n, line in enumerate(lines)]
    assert insert_lines(batch, prefix=line_prefix("tag", 0), recorded_at=timezone.now()) == 2
    assert len(search("needle")) == 2
    assert len(search("needle", "failed")) == 1
    totals = listing.recovery_totals()
    assert (totals["all"], totals["failed"]) == (2, 1)


# --- the structures behind it --------------------------------------------------------------------


def test_triggers_and_indexes_exist_after_all_migrations():
    # A later migration that rebuilds the events table on SQLite would drop the
    # triggers: this fails until it calls recovery.dashboard.sql.install again.
    assert sql.missing(connection) == []


def _real_counts() -> dict:
    counts: dict = {}
    for event in RecoveryEvent.objects.all():
        day = (event.ts or event.recorded_at).astimezone(UTC).date()
        total, failed = counts.get(day, (0, 0))
        counts[day] = (total + 1, failed + (event.done is False))
    return counts


def test_daily_counts__exact_before_and_after_the_index_catches_up():
    for n in range(6):
        record_event("t", done=n % 3 != 0, deleted_data=n == 4, ts=f"2026-11-{n + 1:02d}T23:59:59Z")
    record_event("t")  # no ts: the day it was recorded
    real = _real_counts()
    first, last = min(real), max(real)
    assert listing.daily_counts(first, last) == real  # tail counted directly (SQLite)
    sql.catch_up(connection)
    assert listing.daily_counts(first, last) == real
    # Now the table itself holds them (on PostgreSQL it always did).
    kept: dict = {}
    for row in DailyCount.objects.filter(events__gt=0):
        total, failed = kept.get(row.day, (0, 0))
        kept[row.day] = (total + row.events, failed + (row.events if row.failed else 0))
    assert kept == real
    deleted = sum(DailyCount.objects.filter(deleted=True).values_list("events", flat=True))
    assert deleted == RecoveryEvent.objects.filter(deleted_data=True).count()


def test_daily_counts__emptied_first_then_events_deleted_leaves_no_negative_rows():
    # What a test-database flush does on SQLite: DELETE FROM each table, in any order.
    record_event("t", ts="2026-11-01T00:00:00Z")
    DailyCount.objects.all().delete()
    RecoveryEvent.objects.all().delete()
    assert not DailyCount.objects.exists()
    assert listing.recovery_totals()["all"] == 0


def _plan(sql_text: str, params: list, disable: tuple[str, ...] = ("seqscan", "sort")) -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # The test table is tiny, so a sequential scan would rightly win; what is
            # checked is that the index *can* serve the query.
            for method in disable:
                cursor.execute(f"SET LOCAL enable_{method} = off")
            cursor.execute(f"EXPLAIN {sql_text}", params)
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql_text}", params)
        return "\n".join(" ".join(str(c) for c in row) for row in cursor.fetchall())


@pytest.mark.parametrize("status", ["all", "failed"])
def test_explain__a_search_uses_the_trigram_index(status):
    record_event("t", detail="something")
    statement, order, kind = listing._indexed_search_sql(status)
    statement = f"{statement} {order}"
    # PostgreSQL may also walk the primary key newest-first and filter (right for a
    # common word); with plain index scans off, the trigram indexes must serve it.
    plan = _plan(f"{statement} LIMIT 10", listing._params(kind, "something"),
                 disable=("seqscan", "indexscan"))  # fmt: skip
    if connection.vendor == "postgresql":
        # With the Failed filter the (small) partial index of failed events is as good.
        wanted = "detail_trgm" if status == "all" else "(_trgm|recovery_event_failed)"
        assert re.search(rf"Bitmap Index Scan on \S*{wanted}", plan), plan
    else:
        assert re.search(r"VIRTUAL TABLE INDEX \d+:M", plan), plan  # FTS5's MATCH index
        if status == "all":
            assert "TEMP B-TREE" not in plan, plan  # rowids come out in order: no sort
        else:  # the newest FILTERED_SCAN matches, filtered, then sorted: a bounded sort
            assert re.search(r"LIMIT %s\) AS m", statement), statement


def test_explain__the_last_page_is_read_backwards_without_offset_over_everything():
    # Ascending: the last page of the Failed filter is the start of its index.
    queryset = RecoveryEvent.objects.failed().order_by("id")[:10]
    plan = queryset.explain() if connection.vendor == "sqlite" else _plan(*_compiled(queryset))
    assert "recovery_event_failed" in plan, plan
    assert "TEMP B-TREE" not in plan, plan  # SQLite's sort
    assert "Sort" not in plan, plan  # PostgreSQL's


def test_explain__warnings_and_errors_use_their_partial_index():
    queryset = listing.severe_events().newest_first()[:10]
    plan = queryset.explain() if connection.vendor == "sqlite" else _plan(*_compiled(queryset))
    assert "recovery_event_severe" in plan, plan
    assert "TEMP B-TREE" not in plan, plan  # SQLite's sort
    assert "Sort" not in plan, plan  # PostgreSQL's


def test_recent_problems__are_the_newest_problems():
    for n in range(30):
        severity = ("info", "warning", "error")[n % 3]
        record_event("t", detail=str(n), severity=severity, done=None if n % 4 else False)
    expected = list(RecoveryEvent.objects.problems().newest_first()[:10])
    assert listing.recent_problems(10) == expected
    assert len(expected) == 10


def _compiled(queryset) -> tuple[str, list]:
    statement, params = queryset.query.sql_with_params()
    return statement, list(params)


# --- Jobs and Security search: literal too ------------------------------------------------------

# Every character a regular expression, LIKE or FTS5 reading would treat specially.
METACHARACTERS = [*".*+?^${}()|[]\\", "%", "_"]
assert len(METACHARACTERS) == 16


def _literal(q: str, *values: str | None) -> bool:
    return any(q.lower() in (value or "").lower() for value in values)


@pytest.mark.parametrize("char", METACHARACTERS)
def test_jobs_search__metacharacters_are_literal(client_for, char):
    from durable import jobs

    made = [jobs.enqueue("durable.noop", {}, owner=f"a{c}b") for c in METACHARACTERS]
    made += [jobs.enqueue("durable.noop", {}, owner=owner) for owner in ("axb", "ab", "aab", "a")]
    admin = client_for("admin")
    for q in (char, f"a{char}b", f"{char}b"):
        html = admin.get(reverse("problems:jobs"), {"q": q, "per_page": "100"}).content.decode()
        found = {int(n) for n in re.findall(r'id="job-(\d+)"', html)}
        expected = {
            job.pk for job in made if _literal(q, job.operation, job.owner, job.lease_owner)
        }
        assert found == expected, q
    assert len(expected) == 1  # "a{char}b" and "{char}b": only the job that holds it


@pytest.mark.parametrize("char", METACHARACTERS)
def test_security_search__metacharacters_are_literal(client_for, char):
    from recovery.models import SecurityEvent
    from recovery.records import record_security

    for c in METACHARACTERS:
        record_security(category="probe", key=f"k{c}z")
    for key in ("kxz", "kz", "kkz"):
        record_security(category="probe", key=key)
    admin = client_for("admin")
    rows = list(SecurityEvent.objects.all())
    for q in (char, f"k{char}z"):
        html = admin.get(reverse("problems:security"), {"q": q, "per_page": "100"}).content.decode()
        shown = {unescape(key) for key in re.findall(r'<td class="c-type">([^<]*)', html)}
        searched = ("category", "key", "source", "cwe", "detail")
        expected = {r.key for r in rows if _literal(q, *(getattr(r, f) for f in searched))}
        assert shown == expected, q
    assert expected == {f"k{char}z"}
