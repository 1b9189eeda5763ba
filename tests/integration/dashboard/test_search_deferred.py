"""SQLite's deferred search index and day counts: exact at every moment, caught up in bulk.

On PostgreSQL the index and the counts are maintained by the inserting
statement itself (tested by test_search.py on that leg); these tests are
about the SQLite cursor and the tail beyond it.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from durable.jobs import enqueue
from recovery.dashboard import indexing, listing, sql
from recovery.dashboard.listing import recovery_listing
from recovery.dashboard.query import parse_table_query
from recovery.models import DailyCount, RecoveryEvent
from recovery.parsing import parse_line
from recovery.policy import line_prefix
from recovery.records import record_event
from recovery.records.lines import insert_lines
from tests.integration.helpers import drain

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        settings.DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3",
        reason="PostgreSQL maintains its search index and counts in the inserting statement",
    ),
]


def fts_rows() -> int:
    """Documents in the FTS5 index itself (its docsize shadow table: one row per document;
    a count over the external-content table would read the events table instead)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM recovery_event_fts_docsize")
        return cursor.fetchone()[0]


def search(q: str, page: int = 1, per_page: int = 100) -> list[int]:
    query = parse_table_query(
        {"q": q, "page": str(page), "per_page": str(per_page)}, listing.RECOVERY_FILTERS
    )
    return [event.pk for event in recovery_listing(query).rows]


def ingest(texts: list[str]) -> None:
    lines = [parse_line(f'{{"type": "t", "detail": "{text}"}}'.encode()) for text in texts]
    batch = [(n * 100, n, line) for n, line in enumerate(lines)]
    prefix = line_prefix(f"tag-{texts[0]}", 0)
    assert insert_lines(batch, prefix=prefix, recorded_at=timezone.now()) == len(texts)


def test_the_ingest_writes_lines_only__the_catch_up_indexes_and_counts_them():
    ingest(["alpha one", "alpha two", "beta"])
    assert sql.pending(connection) == 3
    assert fts_rows() == 0
    assert not DailyCount.objects.exists()
    with transaction.atomic():
        assert sql.catch_up(connection) == 3
    assert sql.pending(connection) == 0
    assert sql.indexed_upto(connection) == RecoveryEvent.objects.latest("id").pk
    assert fts_rows() == 3
    assert sum(DailyCount.objects.values_list("events", flat=True)) == 3


def test_catch_up__goes_in_batches_and_a_failed_batch_changes_nothing():
    ingest([f"row {n}" for n in range(5)])
    with transaction.atomic():
        assert sql.catch_up(connection, batch=2) == 2
    upto = sql.indexed_upto(connection)

    def crash_before_the_commit() -> None:
        with transaction.atomic():
            sql.catch_up(connection, batch=2)
            raise RuntimeError("crash before the commit")

    with pytest.raises(RuntimeError):
        crash_before_the_commit()
    assert sql.indexed_upto(connection) == upto
    assert fts_rows() == 2
    assert sql.pending(connection) == 3


def test_search_and_totals_are_exact_across_the_cursor_newest_first():
    ingest([f"needle old {n}" for n in range(4)])
    with transaction.atomic():
        sql.catch_up(connection)
    ingest([f"needle new {n}" for n in range(3)])  # the tail
    everything = list(
        RecoveryEvent.objects.filter(detail__contains="needle")
        .order_by("-id")
        .values_list("id", flat=True)
    )
    assert search("needle") == everything
    # Paging crosses from the tail into the index without losing or repeating a row.
    assert (
        search("needle", page=1, per_page=2)
        + search("needle", page=2, per_page=2)
        + search("needle", page=3, per_page=2)
        + search("needle", page=4, per_page=2)
        == everything
    )
    assert listing.recovery_totals()["all"] == 7


def test_deleting_events_adjusts_counts_only_for_those_already_counted():
    record_event("t", detail="indexed", done=False)
    with transaction.atomic():
        sql.catch_up(connection)
    record_event("t", detail="in the tail", done=False)
    assert listing.recovery_totals()["failed"] == 2
    RecoveryEvent.objects.filter(detail="in the tail").delete()
    assert listing.recovery_totals()["failed"] == 1
    RecoveryEvent.objects.filter(detail="indexed").delete()
    assert listing.recovery_totals() == {"all": 0, "failed": 0, "deleted": 0, "done": 0}
    assert not DailyCount.objects.filter(events__lt=0).exists()
    assert search("indexed") == []


def test_the_indexer_job_catches_up_and_is_never_queued_twice(monkeypatch):
    monkeypatch.setattr(indexing, "WORTH_A_JOB", 3)
    ingest([f"line {n}" for n in range(2)])
    assert indexing.request_catch_up(owner="test") is None  # two rows: readers scan them
    ingest([f"more {n}" for n in range(2)])
    first = indexing.request_catch_up(owner="test")
    second = indexing.request_catch_up(owner="test")
    assert first is not None
    assert second.pk == first.pk
    job = drain(first.pk)
    assert job.state == "completed"
    assert sql.pending(connection) == 0
    assert indexing.request_catch_up(owner="test") is None  # nothing waits


def test_a_finished_ingest_asks_for_the_catch_up(tmp_path, monkeypatch):
    monkeypatch.setattr(indexing, "WORTH_A_JOB", 1)
    path = tmp_path / "recovery-events.jsonl"
    path.write_text('{"type": "backup-created", "detail": "x"}\n')
    from django.test import TestCase

    with TestCase.captureOnCommitCallbacks(execute=True):
        drain(enqueue("recovery.ingest", {"path": str(path)}).pk)
    from durable.models import Job

    assert Job.objects.filter(operation=indexing.OPERATION, state="queued").exists()
