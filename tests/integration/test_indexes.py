"""The two hot queries are index scans on both databases (planner output, not timing)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from durable.lease import pick_sql

pytestmark = pytest.mark.django_db

NEWEST_OF_STATE = "SELECT id FROM durable_job WHERE state = %s ORDER BY id DESC LIMIT 10"


def plan(sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Tiny test tables make a sequential scan cheapest; forbid it to see
            # which index the planner would use once the table is large.
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_sort = off")
            cursor.execute("EXPLAIN " + sql, params)
        else:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        return "\n".join(str(row[-1]) for row in cursor.fetchall())


def test_next_due_job__the_claims_own_select_is_an_index_range_scan_without_a_sort():
    sql, params = pick_sql(timezone.now(), queues=["default"], operations=["a", "b"])
    text = plan(sql, params)
    assert "durable_job_due" in text, text
    assert "TEMP B-TREE" not in text, text  # SQLite: no separate sort step
    assert "Sort" not in text, text  # PostgreSQL: no separate sort step


def test_jobs_of_a_state_newest_first__is_an_index_scan():
    text = plan(NEWEST_OF_STATE, ["failed"])
    assert "durable_job_state_newest" in text, text
    assert "TEMP B-TREE" not in text, text
    assert "Sort" not in text, text
