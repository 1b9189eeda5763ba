"""``announce``: the marker and the recovery event commit in one transaction (an outbox).

The crash tests with real workers killed at ``announce.before_commit`` and
``announced`` are in ``test_builtin_ops.py`` (every scenario's crash points).
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from durable import jobs, signals
from durable.builtin.announce import announce
from durable.builtin.models import Announcement
from durable.operations import JobContext
from recovery.models import RecoveryEvent
from tests.opsapp.models import RecordedEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def ctx() -> JobContext:
    job = jobs.enqueue("durable.noop", {})
    return JobContext(job_id=job.pk, operation="durable.noop", input={}, checkpoint=None,
                      attempt=1, worker_id="w", lease_epoch=1)  # fmt: skip


def recorded(ctx: JobContext) -> tuple[int, int, int]:
    return (
        Announcement.objects.filter(job_id=ctx.job_id).count(),
        RecoveryEvent.objects.filter(job_id=ctx.job_id).count(),
        RecordedEvent.objects.filter(job_id=ctx.job_id).count(),
    )


def test_announce__the_event_is_written_in_the_transaction_that_marks_it_sent(ctx):
    with transaction.atomic():
        assert announce(ctx, "backup-created", "backup-created", detail="Backed up")
        # Before any commit, the receivers' rows are already there: nothing waits
        # for an on-commit callback that a crash could prevent.
        assert recorded(ctx) == (1, 1, 1)
        transaction.set_rollback(True)  # the worker dies before the commit
    assert recorded(ctx) == (0, 0, 0)  # neither marker nor event: the replay sends it
    assert announce(ctx, "backup-created", "backup-created", detail="Backed up") is True
    assert announce(ctx, "backup-created", "backup-created", detail="Backed up") is False
    assert recorded(ctx) == (1, 1, 1)
    event = RecoveryEvent.objects.get(job_id=ctx.job_id)
    assert (event.type, event.detail, event.source) == ("backup-created", "Backed up", "worker")


def test_announce__a_receivers_database_error_rolls_the_announcement_back(ctx):
    def broken(sender, **kwargs):
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table_at_all")

    signals.recovery_event.connect(broken, dispatch_uid="test.broken")
    try:
        with pytest.raises(DatabaseError):
            announce(ctx, "k", "backup-created")
    finally:
        signals.recovery_event.disconnect(dispatch_uid="test.broken")
    # No marker without its event: the unit fails and its retry announces it.
    assert recorded(ctx) == (0, 0, 0)
    assert announce(ctx, "k", "backup-created") is True
    assert recorded(ctx) == (1, 1, 1)


def test_announce__a_receivers_other_error_is_logged_and_the_rest_still_record(ctx, caplog):
    def buggy(sender, **kwargs):
        raise ValueError("a bug in some receiver")

    signals.recovery_event.connect(buggy, dispatch_uid="test.buggy")
    try:
        assert announce(ctx, "k", "integrity-ok") is True
    finally:
        signals.recovery_event.disconnect(dispatch_uid="test.buggy")
    assert recorded(ctx) == (1, 1, 1)
    assert "recovery_event receiver failed" in caplog.text


REFUSE_EVENTS = {
    # A real database error from the Recovery table's own insert, not a stand-in.
    "sqlite": [
        "CREATE TRIGGER test_refuse_events BEFORE INSERT ON recovery_recoveryevent "
        "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
    ],
    "postgresql": [
        "CREATE FUNCTION test_refuse_events() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$",
        "CREATE TRIGGER test_refuse_events BEFORE INSERT ON recovery_recoveryevent "
        "FOR EACH ROW EXECUTE FUNCTION test_refuse_events()",
    ],
}
ALLOW_EVENTS = {
    "sqlite": ["DROP TRIGGER test_refuse_events"],
    "postgresql": [
        "DROP TRIGGER test_refuse_events ON recovery_recoveryevent",
        "DROP FUNCTION test_refuse_events()",
    ],
}


def test_announce__a_recovery_event_the_database_refuses_fails_the_announcement(ctx, caplog):
    # record_event never raises for its ordinary callers; inside the outbox it must,
    # or the marker would commit alone and the event would never be written.
    with connection.cursor() as cursor:
        for statement in REFUSE_EVENTS[connection.vendor]:
            cursor.execute(statement)
    try:
        with pytest.raises(DatabaseError, match="refused by the test"):
            announce(ctx, "k", "backup-created", detail="Backed up")
    finally:
        with connection.cursor() as cursor:
            for statement in ALLOW_EVENTS[connection.vendor]:
                cursor.execute(statement)
    assert recorded(ctx) == (0, 0, 0)  # no marker without its event
    assert announce(ctx, "k", "backup-created", detail="Backed up") is True
    assert recorded(ctx)[:2] == (1, 1)
