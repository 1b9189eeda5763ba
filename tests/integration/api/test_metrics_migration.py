"""Migration 0019 on a database with reclaims in it: those already behind the totals'
cursor are added to the new reclaim totals once, so the counter does not drop.

``transaction=True``: migrations run outside the test's transaction (and, on SQLite,
cannot run inside one).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from durable.metrics.totals import reclaim_totals, settle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BEFORE = [("durable", "0018_gate_waits")]
AFTER = [("durable", "0019_metrics_reclaims")]


def migrate(targets: list[tuple[str, str]]):
    """Migrate to ``targets``; the app registry of that state."""
    MigrationExecutor(connection).migrate(targets)
    return MigrationExecutor(connection).loader.project_state(targets).apps


@pytest.fixture
def at_0018():
    old = migrate(BEFORE)
    try:
        yield old
    finally:
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())  # as the suite expects


def test_0019__counts_the_reclaims_behind_the_cursor_once(at_0018):
    now = timezone.now()
    job = at_0018.get_model("durable", "Job")
    event = at_0018.get_model("durable", "JobEvent")
    at_0018.get_model("durable", "MetricsCursor").objects.create(
        name="finished", upto=now - timedelta(minutes=10)
    )
    old = job.objects.create(operation="test.rows", state="completed", finished_at=now)
    for seq, spent in enumerate((True, False, True), start=1):
        event.objects.create(
            job=old,
            seq=seq,
            kind="reclaimed",
            data={"attempt_spent": spent},
            created_at=now - timedelta(hours=1),
        )
    new = job.objects.create(operation="test.flaky", state="running")
    event.objects.create(job=new, seq=1, kind="reclaimed", data={"attempt_spent": False})

    migrate(AFTER)

    expected = {("test.rows", True): 2, ("test.rows", False): 1, ("test.flaky", False): 1}
    assert reclaim_totals(settle(now)) == expected
    # The job that held the older ones is purged: the totals keep them.
    job.objects.filter(pk=old.pk).delete()
    assert reclaim_totals(settle(now)) == expected
