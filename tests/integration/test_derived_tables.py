"""Derived tables (day counts, search index) and the Recovery events through copy and restore.

The counts are kept by a trigger on PostgreSQL and by the indexer on SQLite;
a copy or restore that moved them raw next to the events was counted twice
on PostgreSQL ("recovery.dailycount differs after the copy"). They are
rebuilt from the events instead: these tests copy and restore with the
Recovery app included and compare the counts with a recount of the events.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
from collections import Counter
from pathlib import Path

import pytest
from django.db import connections

from durable import jobs
from durable.builtin.derived import derived_labels, rebuilds_after
from durable.builtin.tables import site_tables
from durable.operations import get_operation
from recovery.dashboard import sql
from recovery.models import DailyCount, RecoveryEvent

from .dataset import alias_url, backup_contents, contents, make_dataset
from .helpers import drain

PG = os.environ.get("DATABASE_URL", "").startswith("postgres")
# The event recorder and the engine tests' side effects; Recovery is *included*.
NOISE = ["opsapp.recordedevent", "testapp.sideeffect"]
WITH_RECOVERY = ["default", "other", "lite"]
# Long enough that a live worker on this busy machine never loses its lease.
LEASE = 10.0


def add_events(alias: str) -> None:
    """Events on three days, failed and deleted among them, indexed as far as the site does."""
    day = dt.datetime(2026, 5, 1, 12, tzinfo=dt.UTC)
    rows = [
        RecoveryEvent(type="backup-created", detail="nightly", ts=day),
        RecoveryEvent(type="restore-backup", detail="replaced", done=False, ts=day),
        RecoveryEvent(
            type="board-permanently-deleted", detail="board x", deleted_data=True, ts=day
        ),
        RecoveryEvent(type="integrity-ok", detail="all good", ts=day + dt.timedelta(days=1)),
        RecoveryEvent(type="corruption-detected", detail="page 7", done=False, ts=None),
    ]
    RecoveryEvent.objects.using(alias).bulk_create(rows)
    if connections[alias].vendor == "sqlite":
        # Indexed and counted, as the indexer job leaves them (a flush between
        # transactional tests empties the cursor table: rebuild sets it up again).
        sql.rebuild(alias)


def counted(alias: str) -> Counter:
    """The counts as the dashboard reads them: the count rows, plus SQLite's unindexed tail."""
    rows = DailyCount.objects.using(alias).values_list("day", "failed", "deleted", "events")
    found = Counter({(d, f, x): n for d, f, x, n in rows if n})
    upto = sql.indexed_upto(connections[alias])
    if upto is not None:
        found.update(recount(alias, after=upto))
    return found


def recount(alias: str, after: int = 0) -> Counter:
    found: Counter = Counter()
    events = RecoveryEvent.objects.using(alias).filter(pk__gt=after)
    for ts, recorded, done, deleted in events.values_list(
        "ts", "recorded_at", "done", "deleted_data"
    ):
        found[((ts or recorded).astimezone(dt.UTC).date(), done is False, deleted)] += 1
    return found


def searchable(alias: str, text: str) -> bool:
    """The event is found by the database's search index (SQLite: FTS5; PostgreSQL: ILIKE)."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                f"SELECT count(*) FROM {sql.FTS} WHERE {sql.FTS} MATCH %s",  # noqa: S608 - constants
                [f'"{text}"'],
            )
        else:
            query = f"SELECT count(*) FROM {sql.EVENTS} WHERE detail ILIKE %s"  # noqa: S608
            cursor.execute(query, [text])
        return cursor.fetchone()[0] > 0


def assert_derived_rebuilt(alias: str) -> None:
    assert counted(alias) == recount(alias)
    assert searchable(alias, "page 7")
    assert not sql.missing(connections[alias])  # the triggers are still in place


def test_registry__recovery_declares_its_counts_and_cursor_derived():
    assert {"recovery.dailycount", "recovery.searchcursor"} <= derived_labels()
    assert [entry.name for entry in rebuilds_after(["recovery.recoveryevent"])] == [
        "recovery.dashboard"
    ]
    assert rebuilds_after(["opsapp.sample"]) == []


@pytest.mark.django_db(databases=["default"])
def test_site_tables__never_include_derived_tables():
    labels = {spec.label for spec in site_tables("default")}
    assert "recovery.recoveryevent" in labels
    assert not labels & derived_labels()


COPIES = [pytest.param("default", "other", id="same-vendor")]
if PG:
    COPIES.append(pytest.param("lite", "other", id="sqlite-to-postgresql"))


@pytest.mark.parametrize(("source", "target"), COPIES)
@pytest.mark.django_db(databases=WITH_RECOVERY)
def test_copy__events_and_day_counts_arrive_with_the_counts_rebuilt(source, target):
    make_dataset(source)
    add_events(source)
    assert counted(source)  # the source has count rows: copied raw, they were counted twice
    job = jobs.enqueue(
        "db.copy", {"source": source, "target": target, "replace": True, "exclude": NOISE}
    )
    job = drain(job.pk, timeout=120)
    assert job.state == "completed", job.reason
    assert contents(target, NOISE) == contents(source, NOISE)
    assert RecoveryEvent.objects.using(target).count() == 5
    assert job.unit_results.get(key="rebuild").result == {"rebuilt": ["recovery.dashboard"]}
    assert not job.unit_results.filter(key__contains="recovery.dailycount").exists()
    assert_derived_rebuilt(target)


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_restore__replacing_the_recovery_tables_rebuilds_the_counts(tmp_path: Path, settings):
    # transaction=True: not needed by a worker; the restore's PostgreSQL LOCK and the
    # test's own transaction must not be one (the counts are recounted after commit).
    settings.DURABLE_BACKUP_DIR = tmp_path
    settings.DURABLE_RESTORE_KEEP_APPS = []
    make_dataset()
    add_events("default")
    backup = drain(
        jobs.enqueue("backup.database", {"name": "with-events", "exclude": NOISE}).pk, timeout=60
    )
    assert backup.state == "completed", backup.reason
    manifest_tables = set(backup.unit_results.get(key="begin").result["tables"])
    assert "recovery.recoveryevent" in manifest_tables
    assert not manifest_tables & derived_labels()  # never backed up
    expected = backup_contents(tmp_path / "with-events")
    RecoveryEvent.objects.filter(detail="nightly").delete()
    RecoveryEvent.objects.create(type="remigrate", detail="after the backup")

    job = jobs.enqueue("restore.database", {"name": "with-events", "replace": True})
    assert "recovery" not in job.input["exclude"]
    job = drain(job.pk, timeout=120)
    assert job.state == "completed", job.reason
    restored = contents("default", NOISE)
    # The restore's own restore-backup event is appended after its check: not the backup's.
    spec = next(s for s in site_tables("default") if s.label == "recovery.recoveryevent")
    position = spec.columns.index("job_id")
    events = restored["recovery.recoveryevent"]
    assert [row for row in events if row[position] == job.pk]
    restored["recovery.recoveryevent"] = [row for row in events if row[position] != job.pk]
    assert restored == expected
    assert_derived_rebuilt("default")


# --- the engine's own events during a copy ------------------------------------------------


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_copy__killed_and_reclaimed_its_own_reclaim_event_is_copied_not_a_failure(workers):
    # transaction=True: worker subprocesses copy the test's rows. The reclaim writes
    # job-reclaimed-after-restart into the source after the events' range was copied.
    make_dataset()
    add_events("default")
    job = jobs.enqueue("db.copy", {"target": "other", "replace": True, "exclude": NOISE})
    env = {"TEST_OTHER_DATABASE_URL": alias_url("other")}
    killed = workers.run(faults="dbcopy.before_verify", lease=LEASE, env=env)
    assert killed.returncode == -signal.SIGKILL, workers.log(killed)
    assert workers.run(lease=LEASE, env=env).returncode == 0
    job.refresh_from_db()
    assert (job.state, job.reclaims) == ("completed", 1), job.reason
    reclaimed = RecoveryEvent.objects.filter(job_id=job.pk, type="job-reclaimed-after-restart")
    assert reclaimed.count() == 1
    assert RecoveryEvent.objects.using("other").filter(pk=reclaimed.get().pk).exists()
    assert contents("other", NOISE) == contents("default", NOISE)
    assert_derived_rebuilt("other")


@pytest.mark.parametrize("when", ["verified:recovery.recoveryevent", "tail:0"])
@pytest.mark.django_db(databases=["default", "other"])
def test_copy__an_event_appended_after_its_table_was_verified_is_copied_by_the_tail(
    monkeypatch, when
):
    make_dataset()
    add_events("default")
    operation = get_operation("db.copy")
    real = operation.run_unit

    def meanwhile(ctx, unit):
        # Before the table's close runs; or after the last tail ran (its checkpoint not
        # yet committed), as when the job is taken back after its last unit.
        result = real(ctx, unit) if unit.key == "tail:0" else None
        if unit.key == when and not RecoveryEvent.objects.filter(detail="late").exists():
            RecoveryEvent.objects.create(type="job-reclaimed-after-restart", detail="late")
        return result if unit.key == "tail:0" else real(ctx, unit)

    monkeypatch.setattr(operation, "run_unit", meanwhile)
    job = drain(
        jobs.enqueue("db.copy", {"target": "other", "replace": True, "exclude": NOISE}).pk,
        timeout=120,
    )
    assert job.state == "completed", job.reason
    assert RecoveryEvent.objects.using("other").filter(detail="late").exists()
    assert contents("other", NOISE) == contents("default", NOISE)
    tails = dict(job.unit_results.filter(key__startswith="tail:").values_list("key", "result"))
    if when == "tail:0":  # appended after the last tail: one more tail takes it
        assert tails["tail:0"]["recovery.recoveryevent"]["rows"] == 5
        assert tails["tail:1"]["recovery.recoveryevent"]["rows"] == 6
    else:
        assert sorted(tails) == ["tail:0"]
        assert tails["tail:0"]["recovery.recoveryevent"]["rows"] == 6


@pytest.mark.parametrize("change", ["changed", "deleted"])
@pytest.mark.django_db(databases=["default", "other"])
def test_copy__an_event_changed_or_deleted_during_the_copy_still_fails_it(monkeypatch, change):
    make_dataset()
    add_events("default")
    operation = get_operation("db.copy")
    real = operation.run_unit

    def meanwhile(ctx, unit):
        # A change is seen by the batch verifying its row; a deletion by the counts, even
        # at the very end (a change made after its batch was verified is not seen).
        when = "verify:recovery.recoveryevent:0" if change == "changed" else "tail:0"
        if unit.key == when:
            events = RecoveryEvent.objects.filter(detail="nightly")
            events.update(detail="edited") if change == "changed" else events.delete()
        return real(ctx, unit)

    monkeypatch.setattr(operation, "run_unit", meanwhile)
    job = drain(
        jobs.enqueue("db.copy", {"target": "other", "replace": True, "exclude": NOISE}).pk,
        timeout=120,
    )
    assert job.state == "failed"
    assert "recovery.recoveryevent differs after the copy" in job.reason
