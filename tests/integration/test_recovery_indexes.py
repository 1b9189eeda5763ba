"""The Recovery report's queries are index scans in newest-first order, on both databases.

Issue 5 pages a million events: newest first, keyset ``before()``, and the
Done / Failed / Deleted filters must never sort the table. On PostgreSQL an
almost empty test table would rightly be read sequentially (or sorted), so
the planner is told to avoid that: what is checked is that an index *can*
serve each query in order (no Sort node). ``bench/ingest.py`` prints the plans on a
million real rows.
"""

from __future__ import annotations

import pytest
from django.db import connection

from recovery.models import RecoveryEvent

pytestmark = pytest.mark.django_db


def plan(queryset) -> str:
    if connection.vendor == "postgresql":
        # Discouraged, not forbidden: if no index could deliver the order, a
        # Sort would still appear. SET LOCAL lasts for this test's transaction.
        with connection.cursor() as cursor:
            for method in ("seqscan", "bitmapscan", "sort"):
                cursor.execute(f"SET LOCAL enable_{method} = off")
    return queryset[:10].explain()


PRIMARY_KEY = "pkey" if connection.vendor == "postgresql" else "recovery_recoveryevent"
QUERIES = {
    # Newest first is the primary key read backwards (SQLite: the table itself).
    "newest first": (lambda: RecoveryEvent.objects.newest_first(), PRIMARY_KEY),
    "done": (lambda: RecoveryEvent.objects.done().newest_first(), PRIMARY_KEY),
    "next page": (lambda: RecoveryEvent.objects.newest_first().before(1000), PRIMARY_KEY),
    "failed": (lambda: RecoveryEvent.objects.failed().newest_first(), "recovery_event_failed"),
    "deleted": (lambda: RecoveryEvent.objects.deleted().newest_first(), "recovery_event_deleted"),
    "failed, next page": (
        lambda: RecoveryEvent.objects.failed().newest_first().before(1000),
        "recovery_event_failed",
    ),
    "a job's events": (
        lambda: RecoveryEvent.objects.for_job(5).order_by("-id"),
        "recovery_event_job",
    ),
}


@pytest.mark.parametrize("name", QUERIES)
def test_recovery_queries__use_their_index_in_order(name):
    make, index = QUERIES[name]
    text = plan(make())
    assert index in text, text
    if connection.vendor == "postgresql":
        assert "Sort" not in text, text
        assert "Index" in text, text
    else:
        assert "TEMP B-TREE" not in text, text  # SQLite's word for sorting


def test_done_filter__counts_legacy_events_without_done_as_done():
    RecoveryEvent.objects.create(type="a", done=None)
    RecoveryEvent.objects.create(type="b", done=True)
    RecoveryEvent.objects.create(type="c", done=False)
    assert sorted(RecoveryEvent.objects.done().values_list("type", flat=True)) == ["a", "b"]
    assert list(RecoveryEvent.objects.failed().values_list("type", flat=True)) == ["c"]


def test_before__pages_through_everything_once_newest_first():
    rows = [RecoveryEvent.objects.create(type=f"t{n}") for n in range(7)]
    seen, after = [], None
    while True:
        page = RecoveryEvent.objects.newest_first()
        if after is not None:
            page = page.before(after.pk)
        page = list(page[:3])
        if not page:
            break
        seen += page
        after = page[-1]
    assert [row.pk for row in seen] == [row.pk for row in reversed(rows)]
    assert [row.recorded_at for row in seen] == sorted(
        (row.recorded_at for row in rows), reverse=True
    )
