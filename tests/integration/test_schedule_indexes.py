"""The query every worker runs on every heartbeat is an index range scan on both databases."""

from __future__ import annotations

import pytest
from django.db import connection

from durable.schedules.service import due_sql

pytestmark = pytest.mark.django_db


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


def test_due_schedules__is_an_index_range_scan_without_a_sort():
    text = plan(*due_sql())  # by default bounded by the database's clock on PostgreSQL
    assert "durable_schedule_due" in text, text
    assert "TEMP B-TREE" not in text, text  # SQLite: no separate sort step
    assert "Sort" not in text, text  # PostgreSQL: no separate sort step
    if connection.vendor == "postgresql":
        assert "Index Cond: (next_run_at <= statement_timestamp())" in text, text
