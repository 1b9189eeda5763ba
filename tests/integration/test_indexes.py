"""The two hot queries are index scans on both databases (planner output, not timing)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from durable import jobs
from durable.lease import claim_sql, pick_sql
from durable.models import Job
from durable.sql import statements

pytestmark = pytest.mark.django_db

NEWEST_OF_STATE = "SELECT id FROM durable_job WHERE state = %s ORDER BY id DESC LIMIT 10"


def plan(sql: str, params: list, *, as_if_large: bool = True) -> str:
    """The plan's text. ``as_if_large=False``: the planner's own settings, for tables
    made large and analyzed by the test itself."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            if as_if_large:
                # Tiny test tables make a sequential scan cheapest; forbid it to see
                # which index the planner would use once the table is large.
                cursor.execute("SET LOCAL enable_seqscan = off")
                cursor.execute("SET LOCAL enable_sort = off")
            cursor.execute("EXPLAIN " + sql, params)
        else:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        return "\n".join(str(row[-1]) for row in cursor.fetchall())


def analyze() -> None:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_job" if connection.vendor == "postgresql" else "ANALYZE")


def test_next_due_job__the_claims_own_select_is_an_index_range_scan_without_a_sort():
    sql, params = pick_sql(timezone.now(), queues=["default"], operations=["a", "b"])
    text = plan(sql, params)
    assert "durable_job_due" in text, text
    assert "TEMP B-TREE" not in text, text  # SQLite: no separate sort step
    assert "Sort" not in text, text  # PostgreSQL: no separate sort step


def test_next_due_job__a_deep_analyzed_queue_is_read_in_index_order_not_scanned_and_sorted():
    """With the planner's own settings and true statistics of a deep queue.

    PostgreSQL made the paused-queue condition, a correlated ``NOT EXISTS``, an
    anti-join it guessed would keep one row of the whole queue (every job is in
    ``default``, and an unanalyzed empty table is guessed to hold it), so it read
    and sorted every queued job per claim: 2 ms at 3,000 queued, 17 ms at 20,000.
    SQLite, once analyzed, skip-scanned the priorities to range on
    ``next_attempt_at`` and sorted too (12.8 ms at 20,000).
    """
    jobs.enqueue_many("durable.noop", [{"units": 1}] * 3000)
    analyze()
    sql, params = pick_sql(timezone.now(), queues=["default"], operations=["durable.noop"])
    text = plan(sql, params, as_if_large=False)
    assert "durable_job_due" in text, text
    assert "Seq Scan on durable_job " not in text, text
    assert "Sort" not in text, text
    assert "TEMP B-TREE" not in text, text


def test_next_due_job__several_deep_queues_are_each_read_in_order_not_all_sorted():
    """PostgreSQL sorted every due job of all a worker's queues per claim (11 ms at
    20,000); each queue is now read in index order up to the claim's limit."""
    for queue in ("default", "mail"):
        jobs.enqueue_many("durable.noop", [{"units": 1}] * 1500, queue=queue)
    sql, params = pick_sql(
        timezone.now(), queues=["default", "mail"], operations=["durable.noop"], limit=3
    )
    analyze()
    if connection.vendor != "postgresql":
        text = plan(sql, params, as_if_large=False)
        assert "USING INDEX durable_job_due (queue=?)" in text, text
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
            nodes = list(_plan_nodes(cursor.fetchone()[0][0]["Plan"]))
            read = [n for n in nodes if n.get("Relation Name") == "durable_job"]
            assert read, nodes
            assert all(n["Index Name"] == "durable_job_due" for n in read), read
            assert sum(n["Actual Rows"] * n["Actual Loops"] for n in read) <= 2 * 3, read
        cursor.execute(sql, params)
        assert len(cursor.fetchall()) == 3


def _plan_nodes(node: dict):
    yield node
    for child in node.get("Plans", []):
        yield from _plan_nodes(child)


@pytest.mark.parametrize("count", [1, 3])
def test_claim__finds_the_picked_rows_by_primary_key_not_by_scanning_the_queue(count):
    """The pick reads durable_job_due once; the UPDATE looks its rows up by id. Reading
    durable_job_due again for an id (its last column) costs every queued job per claim."""
    sql, params = claim_sql(
        timezone.now(),
        owner="w",
        queues=["default"],
        operations=["a", "b"],
        lease_seconds=30,
        count=count,
    )
    # Statistics that describe an empty queue (2,000 finished jobs) while jobs are
    # due: how a queue that just filled looks to the planner until the next ANALYZE.
    jobs.enqueue_many("durable.noop", [{"units": 1}] * 2000)
    Job.objects.update(state="completed")
    analyze()
    Job.objects.update(state="queued")
    text = plan(sql, params)
    assert text.count("durable_job_due") == 1, text  # the pick's own scan
    if connection.vendor == "postgresql":
        assert "durable_job_pkey" in text, text
    else:
        assert "SCAN durable_job" not in text, text  # SQLite: no full scan either


def test_jobs_of_a_state_newest_first__is_an_index_scan():
    text = plan(NEWEST_OF_STATE, ["failed"])
    assert "durable_job_state_newest" in text, text
    assert "TEMP B-TREE" not in text, text
    assert "Sort" not in text, text


# --- partial indexes that an enqueue does not write (issue 23) ------------------------------

FINISHED_SINCE = (
    "SELECT queue, operation, state, count(*) FROM durable_job "
    "WHERE finished_at >= %s GROUP BY queue, operation, state"
)


def test_finished_jobs__partial_index_still_serves_every_bounded_finished_at_query():
    """durable_job_finished holds finished jobs only; the metrics totals, the console and
    retention's purge all bound finished_at, which implies IS NOT NULL on both databases."""
    # A table like a site's: mostly finished jobs, some queued, analyzed.
    jobs.enqueue_many("durable.noop", [{"units": 1}] * 3000)
    done = list(Job.objects.values_list("pk", flat=True)[:2000])
    Job.objects.filter(pk__in=done).update(state="completed", finished_at=timezone.now())
    analyze()
    since = connection.ops.adapt_datetimefield_value(timezone.now())
    text = plan(FINISHED_SINCE, [since])
    assert "durable_job_finished" in text, text
    purge = Job.objects.purgeable(timezone.now()).values("pk")
    sql, params = purge.query.sql_with_params()
    text = plan(sql, list(params))
    assert "durable_job_finished" in text, text


@pytest.mark.parametrize("count", [1, 3])
def test_unique_key_lookup__is_an_index_scan_of_the_partial_unique_index(count):
    """enqueue's lookup of the unfinished job holding a key (after every collision, and
    for each enqueue_many batch with keys) reads durable_job_unique_unfinished on both
    databases. Through the ORM SQLite scanned the whole table: the state list arrived
    as parameters, which its partial-index matching cannot compare with the index's
    condition."""
    jobs.enqueue_many("durable.noop", [{"units": 1}] * 500)
    analyze()
    sql, params = statements(connection).key_holders([f"k{n}" for n in range(count)])
    text = plan(sql, params)
    assert "durable_job_unique_unfinished" in text, text
    assert "SCAN durable_job" not in text, text
    assert "Seq Scan" not in text, text


def test_unique_key__a_keyless_job_is_not_in_the_unique_index_yet_keys_still_collide():
    """Two keyless jobs coexist; two unfinished jobs with one key do not."""
    jobs.enqueue_many("test.rows", [{"units": 1}] * 2)
    first = jobs.enqueue("test.rows", {"units": 1}, unique_key="same")
    again = jobs.enqueue("test.rows", {"units": 1}, unique_key="same")
    assert (first.created, again.created, again.pk) == (True, False, first.pk)
    assert Job.objects.filter(unique_key__isnull=True).count() == 2
