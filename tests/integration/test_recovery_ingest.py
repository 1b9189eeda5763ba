"""The recovery-events.jsonl ingest on real files, run in the test's own thread.

Subprocess workers (append while a worker runs, SIGKILL, two workers) are in
``test_recovery_workers.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from durable import jobs
from durable.models import Job, UnitResult
from durable.operations import Access, get_operation, may_start
from recovery import operations as ingest_operations
from recovery.dashboard import listing, sql
from recovery.dashboard.listing import recovery_listing
from recovery.dashboard.query import parse_table_query
from recovery.models import DailyCount, EventType, IngestCursor, IngestPath, RecoveryEvent
from recovery.operations import _Batch, job_summary
from recovery.parsing import (
    PARSE_AHEAD_LINES,
    PARSE_AHEAD_THREAD,
    frame_chunk,
    parse_chunk,
    parse_line,
)
from recovery.policy import Position, line_key, line_prefix
from recovery.receivers import enqueue_ingest
from recovery.records import lines
from recovery.records.cursors import advance_cursor, follow, position_of
from recovery.records.lines import insert_lines, parse_ahead_pays
from recovery.tailer import canonical

from .helpers import drain

pytestmark = pytest.mark.django_db


def jsonl(*events: dict | bytes) -> bytes:
    return b"".join(
        item if isinstance(item, bytes) else json.dumps(item).encode() + b"\n" for item in events
    )


def write(path: Path, data: bytes, mode: str = "ab") -> None:
    with open(path, mode) as handle:
        handle.write(data)


def ingest(path: Path, **options: int) -> Job:
    job = enqueue_ingest(str(path))
    if options:
        Job.objects.filter(pk=job.pk).update(input={**job.input, **options})
    job = drain(job.pk, timeout=60)
    assert job.state == "completed", job.reason
    return job


def types(**filters: object) -> list[str]:
    rows = RecoveryEvent.objects.filter(source_line__isnull=False, **filters).order_by("id")
    return list(rows.values_list("type", flat=True))


def summary(job: Job) -> dict:
    return job_summary(job.pk)


def cursor_of(path: Path) -> IngestCursor:
    """The cursor of the file the name held at the last ingest."""
    return IngestPath.objects.get(path=canonical(str(path))).cursor


def line_units(job: Job) -> list[dict]:
    results = UnitResult.objects.filter(job=job, key__startswith="lines:").order_by("id")
    return [row.result for row in results]


def report() -> RecoveryEvent:
    return RecoveryEvent.objects.filter(type=EventType.INGEST_REPORT).latest("id")


@pytest.fixture
def events_file(tmp_path: Path) -> Path:
    return tmp_path / "recovery-events.jsonl"


# --- what is imported ----------------------------------------


def test_ingest__imports_valid_lines_and_counts_every_other_reason(events_file):
    write(
        events_file,
        b"\xef\xbb\xbf"  # a BOM before the first line
        + jsonl({"type": "backup-created", "db": "wekan", "ts": "2026-11-30T10:00:00Z"})
        + b'{"type":"backup-verified","severity":"WARN"}\r\n'  # CRLF
        + b"\n   \n"  # blank lines
        + b"this is not json\n"
        + b"[1, 2, 3]\n"
        + b'{"db": "wekan"}\n'  # no type
        + b'{"type": "caf\xe9"}\n'  # Latin-1, not UTF-8
        + b'{"type":"huge","detail":"'
        + b"x" * 1_000_000
        + b'"}\n'  # a 1 MB line
        + jsonl(
            {"type": "integrity-ok", "ts": ""},  # empty ts is fine
            {"type": "restore-prev", "ip": "not-an-address"},
            {"type": "integrity-ok", "ts": ""},  # a duplicate line is a second event
        ),
    )
    job = ingest(events_file)
    assert types() == [
        "backup-created", "backup-verified", "integrity-ok", "restore-prev", "integrity-ok",
    ]  # fmt: skip
    first = RecoveryEvent.objects.get(type="backup-created")
    assert (first.db, first.ts.isoformat(), first.source) == (
        "wekan",
        "2026-11-30T10:00:00+00:00",
        "startup",
    )
    assert RecoveryEvent.objects.get(type="backup-verified").severity == "warning"
    assert RecoveryEvent.objects.filter(type="integrity-ok", ts__isnull=True).count() == 2
    assert summary(job)["skipped"] == {
        "blank": 2,
        "malformed_json": 1,
        "not_object": 1,
        "missing_type": 1,
        "invalid_utf8": 1,
        "too_long": 1,
    }
    assert summary(job)["imported"] == 5
    # One report for the run, telling an operator what was skipped and where.
    detail = report().detail
    assert "Imported 5 of 12 lines" in detail
    assert "1 malformed JSON (first at byte" in detail
    assert "1 longer than 8 KiB" in detail
    assert "Dropped 1 invalid IP address(es)." in detail
    assert report().severity == "warning"
    assert RecoveryEvent.objects.filter(type=EventType.INGEST_REPORT).count() == 1
    assert job.events.filter(kind="ingested").exists()
    cursor = cursor_of(events_file)
    assert cursor.offset == events_file.stat().st_size
    assert (cursor.lines_imported, cursor.lines_skipped) == (5, 7)


def test_ingest__a_clean_run_records_no_report(events_file):
    write(events_file, jsonl({"type": "backup-created"}, {"type": "integrity-ok"}))
    ingest(events_file)
    assert types() == ["backup-created", "integrity-ok"]
    assert not RecoveryEvent.objects.filter(type=EventType.INGEST_REPORT).exists()


def test_ingest__normalised_fields_reach_the_database(events_file):
    line = {
        "type": "board-permanently-deleted",
        "severity": "error",
        "done": False,
        "deletedData": True,
        "userId": "u1",
        "username": "alice",
        "ipv6": "::ffff:203.0.113.9",
        "boardIds": ["b1", "b2"],
        "boardTitles": ["Roadmap"],
        "detail": "<script>alert(1)</script>",
    }
    write(events_file, jsonl(line))
    ingest(events_file)
    event = RecoveryEvent.objects.get(type="board-permanently-deleted")
    assert (event.done, event.deleted_data, event.severity) == (False, True, "error")
    assert (event.user_id, event.username) == ("u1", "alice")
    assert (event.ipv4, event.ipv6) == ("203.0.113.9", None)  # mapped IPv6 stored as IPv4
    assert (event.object_ids, event.object_titles) == (["b1", "b2"], ["Roadmap", "(unknown title)"])
    assert event.detail == "<script>alert(1)</script>"  # stored as text; escaped on display
    assert RecoveryEvent.objects.failed().get() == event
    assert RecoveryEvent.objects.deleted().get() == event


# --- reading only what is new ----------------------------------------


def test_ingest__after_an_append_reads_only_the_new_bytes(events_file):
    write(events_file, jsonl(*({"type": "backup-created", "detail": str(n)} for n in range(100))))
    ingest(events_file)
    size = events_file.stat().st_size
    write(events_file, jsonl(*({"type": "integrity-ok", "detail": str(n)} for n in range(10))))
    job = ingest(events_file)
    units = line_units(job)
    assert [unit["start"] for unit in units] == [size]  # started at the old end
    assert sum(unit["lines"] for unit in units) == 10
    assert types().count("backup-created") == 100
    assert types().count("integrity-ok") == 10
    # Nothing new: nothing read, nothing imported.
    job = ingest(events_file)
    assert line_units(job) == []
    assert RecoveryEvent.objects.filter(source_line__isnull=False).count() == 110


def test_ingest__a_partial_last_line_waits_for_the_writer(events_file):
    write(events_file, jsonl({"type": "backup-created"}) + b'{"type": "restore-ba')
    ingest(events_file)
    assert types() == ["backup-created"]
    write(events_file, b'ckup", "detail": "from backup/2"}\n')
    ingest(events_file)
    assert types() == ["backup-created", "restore-backup"]
    assert RecoveryEvent.objects.get(type="restore-backup").detail == "from backup/2"


def test_ingest__batches_are_units_and_the_checkpoint_is_offset_plus_identity(
    events_file, settings
):
    settings.DURABLE_UNIT_TARGET_SECONDS = 60.0  # every unit is quick: each doubles the last
    write(events_file, jsonl(*({"type": f"t{n}"} for n in range(5))))
    job = ingest(events_file, batch_lines=2)
    # Paced (durable.pacing): small first after the claim, then never above batch_lines.
    assert [unit["lines"] for unit in line_units(job)] == [1, 2, 2]
    info = events_file.stat()
    checkpoint = job.checkpoint
    assert checkpoint["offset"] == info.st_size
    assert checkpoint["file"] == f"{info.st_dev}:{info.st_ino}"
    assert checkpoint["generation"] == 0
    assert {"head", "tail", "crc"} <= set(checkpoint)
    assert types() == [f"t{n}" for n in range(5)]


def test_ingest__a_line_longer_than_a_batch_is_skipped_across_reads(events_file):
    write(
        events_file,
        jsonl({"type": "before"})
        + b'{"type":"huge","detail":"' + b"y" * 100_000 + b'"}\n'
        + jsonl({"type": "after"}),
    )  # fmt: skip
    job = ingest(events_file, batch_bytes=16 * 1024)
    assert types() == ["before", "after"]
    assert summary(job)["skipped"] == {"too_long": 1}


def test_ingest__a_runaway_partial_line_is_not_reread_on_every_run(events_file):
    write(events_file, jsonl({"type": "before"}) + b'{"type": "x", "detail": "' + b"z" * 50_000)
    first = ingest(events_file, batch_bytes=16 * 1024)
    cursor = cursor_of(events_file)
    assert cursor.skipping  # known too long, consumed, waiting for its end
    assert cursor.offset == events_file.stat().st_size
    assert summary(first)["skipped"] == {}
    write(events_file, b"z" * 10_000)  # the writer goes on...
    again = ingest(events_file, batch_bytes=16 * 1024)
    assert [unit["start"] for unit in line_units(again)] == [cursor.offset]  # only new bytes
    write(events_file, b'"}\n' + jsonl({"type": "after"}))  # ...and finally ends the line
    last = ingest(events_file, batch_bytes=16 * 1024)
    assert summary(last)["skipped"] == {"too_long": 1}
    assert types() == ["before", "after"]


# --- a file that changed under us ----------------------------------------


def test_ingest__truncation_starts_again_and_keeps_identical_new_lines(events_file):
    write(events_file, jsonl({"type": "integrity-ok"}, {"type": "backup-created"}))
    ingest(events_file)
    # The log is cleared and the next boot writes the very same first line again.
    write(events_file, jsonl({"type": "integrity-ok"}), mode="wb")
    ingest(events_file)
    assert types() == ["integrity-ok", "backup-created", "integrity-ok"]
    assert "truncated" in report().detail
    assert cursor_of(events_file).generation == 1


def test_ingest__rewritten_in_place_with_the_same_size_is_noticed(events_file):
    write(events_file, jsonl({"type": "aaaa"}))
    ingest(events_file)
    write(events_file, jsonl({"type": "bbbb"}), mode="r+b")  # same length, same inode
    ingest(events_file)
    assert types() == ["aaaa", "bbbb"]
    assert "rewritten" in report().detail


def test_ingest__rotation_finishes_the_old_file_then_reads_the_new_one(events_file):
    write(events_file, jsonl({"type": "old-1"}, {"type": "old-2"}))
    ingest(events_file)
    write(events_file, jsonl({"type": "old-3"}))  # written just before the rotation
    write(events_file, b'{"type": "old-4"}')  # its last line never got its newline
    events_file.rename(events_file.with_name("recovery-events.jsonl.1"))
    write(events_file, jsonl({"type": "new-1"}, {"type": "new-2"}))
    job = ingest(events_file)
    assert types() == ["old-1", "old-2", "old-3", "old-4", "new-1", "new-2"]
    assert "rotated" in report().detail
    assert any("recovery-events.jsonl.1" in note for note in summary(job)["notes"])
    write(events_file, jsonl({"type": "new-3"}))
    ingest(events_file)  # and the next run simply continues in the new file
    assert types()[-2:] == ["new-2", "new-3"]
    assert len(types()) == 7


def test_ingest__replacement_with_an_identical_first_line_is_a_new_file(events_file):
    write(events_file, jsonl({"type": "integrity-ok"}, {"type": "backup-created"}))
    ingest(events_file)
    old_inode = events_file.stat().st_ino
    replacement = events_file.with_name("tmp")
    write(replacement, jsonl({"type": "integrity-ok"}, {"type": "remigrate"}, {"type": "x"}))
    os.replace(replacement, events_file)
    assert events_file.stat().st_ino != old_inode
    ingest(events_file)
    assert types() == ["integrity-ok", "backup-created", "integrity-ok", "remigrate", "x"]
    assert "replaced by a new one" in report().detail


def test_ingest__a_new_file_repeating_every_imported_byte__imports_only_its_additions(events_file):
    """A deliberate choice (docs/how-to/feed-recovery-events.md, Limits): a file that
    begins with exactly the bytes already imported is the old file moved — rewritten
    through a temporary copy, restored from a backup, copied to another disk — and is
    continued."""
    old = jsonl({"type": "integrity-ok"}, {"type": "backup-created"})
    write(events_file, old)
    ingest(events_file)
    replacement = events_file.with_name("tmp")  # a writer that rewrites via a temporary copy
    write(replacement, old + jsonl({"type": "restore-backup"}))
    os.replace(replacement, events_file)
    job = ingest(events_file)
    assert types() == ["integrity-ok", "backup-created", "restore-backup"]
    assert summary(job)["lines"] == 1  # only the addition was read
    assert "same first" in report().detail
    # It goes on as one file: the next append is read, the old lines never again.
    write(events_file, jsonl({"type": "remigrate"}))
    ingest(events_file)
    assert types() == ["integrity-ok", "backup-created", "restore-backup", "remigrate"]


# --- one file under several names ----------------------------------------


def test_ingest__through_a_symlinked_directory_is_the_same_file(tmp_path):
    real = tmp_path / "common"
    real.mkdir()
    (tmp_path / "current").symlink_to(real)  # a snap's current -> its revision, say
    direct, linked = real / "recovery-events.jsonl", tmp_path / "current" / "recovery-events.jsonl"
    write(direct, jsonl({"type": "a"}, {"type": "b"}))
    ingest(direct)
    write(direct, jsonl({"type": "c"}))
    job = ingest(linked)
    assert job.input["path"] == str(direct)  # one spelling: the symlink resolved
    assert types() == ["a", "b", "c"]
    assert summary(job)["lines"] == 1
    assert ingest(direct).input["path"] == str(direct)
    assert len(types()) == 3
    assert IngestPath.objects.count() == 1
    # ...so asking under either name while one is unfinished is the same job.
    assert enqueue_ingest(str(direct)).pk == enqueue_ingest(str(linked)).pk


def test_ingest__a_hard_link_is_the_same_file_and_the_same_lines(tmp_path):
    first, second = tmp_path / "a" / "recovery-events.jsonl", tmp_path / "b" / "events.jsonl"
    first.parent.mkdir()
    second.parent.mkdir()
    write(first, jsonl({"type": "a"}, {"type": "b"}))
    os.link(first, second)
    ingest(first)
    write(second, jsonl({"type": "c"}))
    job = ingest(second)
    assert types() == ["a", "b", "c"]
    assert summary(job)["lines"] == 1  # read from where the other name got
    ingest(first)
    assert types() == ["a", "b", "c"]
    (cursor,) = IngestCursor.objects.all()  # one file, one cursor...
    assert cursor.lines_imported == 3
    assert set(IngestPath.objects.values_list("cursor", flat=True)) == {cursor.pk}  # ...two names


def test_ingest__a_hard_link_found_after_its_cursor_was_lost_imports_nothing_twice(tmp_path):
    first, second = tmp_path / "recovery-events.jsonl", tmp_path / "copy-of-name.jsonl"
    write(first, jsonl({"type": "a"}, {"type": "b"}))
    os.link(first, second)
    ingest(first)
    IngestCursor.objects.all().delete()  # e.g. the database restored from an older backup
    job = ingest(second)
    # The identity of a line is the file's, not the name's: a replay under
    # another name matches every line already imported.
    assert summary(job)["duplicates"] == 2
    assert types() == ["a", "b"]


# --- rotations that copy ----------------------------------------


def copytruncate(path: Path) -> Path:
    """What logrotate's ``copytruncate`` does: copy to ``.1`` (a new inode), truncate in place."""
    rotated = path.with_name(path.name + ".1")
    shutil.copyfile(path, rotated)
    with open(path, "r+b") as handle:
        handle.truncate(0)
    return rotated


def test_ingest__copytruncate_finishes_the_copy_then_reads_the_truncated_file(events_file):
    write(events_file, jsonl({"type": "old-1"}, {"type": "old-2"}))
    ingest(events_file)
    write(events_file, jsonl({"type": "old-3"}, {"type": "old-4"}))  # after the last look...
    rotated = copytruncate(events_file)  # ...and before the copy: only in .1 now
    write(events_file, jsonl({"type": "new-1"}))
    job = ingest(events_file)
    assert types() == ["old-1", "old-2", "old-3", "old-4", "new-1"]
    assert any(f"copied: finishing {rotated}" in note for note in summary(job)["notes"])
    assert "copytruncate" in report().detail
    write(events_file, jsonl({"type": "new-2"}))
    ingest(events_file)
    assert types()[-2:] == ["new-1", "new-2"]
    assert len(types()) == 6


def test_ingest__copytruncate_then_more_than_was_read__still_finishes_the_copy(events_file):
    write(events_file, jsonl({"type": "old-1"}))
    ingest(events_file)
    write(events_file, jsonl({"type": "old-2"}))
    copytruncate(events_file)
    # The writer filled the truncated file past the old offset before the next look:
    # same inode, at least as long, other bytes — rewritten.
    write(events_file, jsonl(*({"type": f"new-{n}"} for n in range(5))))
    ingest(events_file)
    assert types() == ["old-1", "old-2", *(f"new-{n}" for n in range(5))]
    assert "rewritten" in report().detail
    assert "copytruncate" in report().detail


def test_ingest__an_older_rotation_beginning_with_the_same_bytes_is_not_taken_for_the_copy(
    events_file,
):
    same_start = jsonl({"type": "integrity-ok"})  # every boot writes the same first line
    write(events_file, same_start + jsonl({"type": "day-1"}))
    ingest(events_file)
    os.rename(events_file, events_file.with_name("recovery-events.jsonl.2"))
    write(events_file, same_start)
    ingest(events_file)  # finishes .2 (nothing left), then the new file: one line
    with open(events_file, "r+b") as handle:
        handle.truncate(0)  # truncated with no copy made (a compressing rotation, say)
    write(events_file, jsonl({"type": "day-3"}))
    ingest(events_file)
    # .2 begins with exactly the bytes read from the truncated file, but it is a
    # file the ingest already finished: its day-1 line is not imported again.
    assert types() == ["integrity-ok", "day-1", "integrity-ok", "day-3"]


def test_ingest__rotation_is_found_among_many_older_siblings_by_time_not_name(events_file):
    """With dateext and weeks of compressed siblings, the file rotated a moment ago
    sorts last by name; it is the newest by time."""
    write(events_file, jsonl({"type": "old-1"}))
    ingest(events_file)
    write(events_file, jsonl({"type": "old-2"}))
    long_ago = 1_700_000_000
    for day in range(210):
        older = events_file.with_name(f"recovery-events.jsonl-2025{day:04d}.gz")
        older.write_bytes(b"\x1f\x8b old")
        os.utime(older, (long_ago + day, long_ago + day))
    events_file.rename(events_file.with_name("recovery-events.jsonl-20261201"))
    write(events_file, jsonl({"type": "new-1"}))
    ingest(events_file)
    assert types() == ["old-1", "old-2", "new-1"]
    assert "rotated" in report().detail


def test_ingest__a_missing_file_completes_with_nothing_to_do(events_file):
    job = ingest(events_file)
    assert job.events.filter(kind="nothing_to_import").exists()
    assert not RecoveryEvent.objects.exists()


def test_ingest__a_directory_fails_with_a_clear_reason(tmp_path):
    job = enqueue_ingest(str(tmp_path))
    job = drain(job.pk)
    assert job.state == "failed"
    assert "is not a regular file" in job.reason


# --- parsed a step ahead, on a thread ----------------------------------------


def _mixed_lines(count: int) -> bytes:
    """Valid lines with a few of every kind of bad one spread through them."""
    bad = [b"not json", b"[1, 2]", b'{"db": "wekan"}', b"   ", b'{"type": "caf\xe9"}']
    lines = [
        bad[n % len(bad)] if n % 331 == 0 else b'{"type": "t", "detail": "line %d"}' % n
        for n in range(count)
    ]
    return b"\n".join(lines) + b"\n"


def test_ingest__lines_parsed_ahead_on_a_thread_are_counted_as_a_single_reading_counts_them(
    events_file,
):
    data = _mixed_lines(30_000)
    write(events_file, data)
    job = ingest(events_file, batch_lines=10_000)
    # Some units span several 2,000-line steps: on PostgreSQL the read-ahead thread ran.
    assert max(unit["lines"] for unit in line_units(job)) > 2 * PARSE_AHEAD_LINES
    whole = parse_chunk(data, offset=0, crc=0, max_lines=10**6)
    totals = summary(job)
    assert totals["skipped"] == dict(whole.skipped)
    assert totals["imported"] == len(whole.events) == len(types())
    first = {}
    for unit in line_units(job):
        for reason, at in unit["first_skipped"].items():
            first.setdefault(reason, at)
    assert first == whole.first_skipped


def test_ingest__a_unit_that_fails_mid_insert_leaves_no_parse_ahead_thread(monkeypatch):
    data = _mixed_lines(9_000)
    chunk = frame_chunk(data, offset=0, crc=0, max_lines=10_000)
    start = Position.fresh("1:2")
    batch = _Batch(cursor_id=None, expected=start, after=start, chunk=chunk)

    def failing_insert(events, **kwargs):
        for n, _ in enumerate(events):
            if n == 3_000:  # the thread (where there is one) is parsing a step ahead by now
                assert parse_ahead_thread_alive() == parse_ahead_pays()
                raise OSError("the database went away")
        raise AssertionError("not reached")

    monkeypatch.setattr(ingest_operations, "insert_lines", failing_insert)
    with pytest.raises(OSError, match="went away"):
        get_operation("recovery.ingest")._import(batch)
    assert not parse_ahead_thread_alive()


def parse_ahead_thread_alive() -> bool:
    return any(t.name.startswith(PARSE_AHEAD_THREAD) for t in threading.enumerate())


# --- never twice ----------------------------------------


def test_insert_lines__a_replayed_batch_inserts_nothing():
    plain = parse_line(b'{"type": "backup-created"}')
    full = parse_line(b'{"type": "restore-backup", "done": false, "boardIds": ["b1"]}')
    batch = [(0, 11, plain), (30, 12, full), (60, 13, plain)]
    now = timezone.now()
    prefix = line_prefix("tag", 0)
    assert insert_lines(batch, prefix=prefix, recorded_at=now) == 3
    assert insert_lines(batch, prefix=prefix, recorded_at=now) == 0  # the line identity holds
    assert insert_lines([*batch, (90, 14, full)], prefix=prefix, recorded_at=now) == 1
    assert insert_lines(batch, prefix=line_prefix("tag", 1), recorded_at=now) == 3
    assert RecoveryEvent.objects.count() == 7
    # Rows keep file order whatever their shape: ids follow offsets.
    keys = list(RecoveryEvent.objects.order_by("id").values_list("source_line", flat=True))
    assert keys[:4] == [
        line_key(prefix, at, crc) for at, crc in ((0, 11), (30, 12), (60, 13), (90, 14))
    ]
    assert RecoveryEvent.objects.get(source_line=keys[1]).object_ids == ["b1"]


# Every kind of column a line fills: plain, actor, both address families, objects, no ts.
VARIED_LINES = [
    b'{"type": "backup-created", "detail": "needle plain", "db": "wekan",'
    b' "ts": "2026-11-30T10:00:00Z"}',
    b'{"type": "restore-backup", "severity": "error", "done": false, "deleted_data": true,'
    b' "userId": "u1", "username": "admin", "ip": "::ffff:192.0.2.7", "boardIds": ["b1", "b2"],'
    b' "boardTitles": ["One"], "detail": "needle full", "ts": "2026-12-01T00:00:01+02:00"}',
    b'{"type": "integrity-ok", "ip": "2001:db8::1", "detail": "caf\\u00e9 needle", "ts": ""}',
    b'{"type": "remigrate", "ipv4": "198.51.100.4", "objects": [1, 2, 3], "done": true}',
]
_COMPARED = [
    "type", "severity", "source", "db", "detail", "done", "deleted_data", "user_id", "username",
    "ipv4", "ipv6", "object_ids", "object_titles", "object_count", "ts", "recorded_at",
    "operation", "reason", "reclaimed",
]  # fmt: skip


def _rows_of(prefix: str) -> list[tuple]:
    rows = RecoveryEvent.objects.filter(source_line__startswith=prefix).order_by("source_line")
    return list(rows.values_list(*_COMPARED))


def _day_counts() -> list[tuple]:
    return sorted(DailyCount.objects.filter(events__gt=0).values_list("day", "events"))


def _search(q: str) -> list[str]:
    query = parse_table_query({"q": q, "per_page": "100"}, listing.RECOVERY_FILTERS)
    return sorted(event.source_line for event in recovery_listing(query).rows)


def test_insert_lines__the_copy_and_its_fallback_write_the_same_rows_counts_and_search(
    monkeypatch,
):
    """PostgreSQL COPYs a batch, or inserts it skipping lines already there if one is.

    The second batch holds a line already imported: the COPY fails on its
    identity and the batch goes in through the fallback. Both must give the
    same rows, the same day counts and the same search results (SQLite has
    one path; the same assertions hold there).
    """
    batch = [(n * 100, n, parse_line(raw)) for n, raw in enumerate(VARIED_LINES)]
    assert all(isinstance(event, tuple) for _, _, event in batch)
    now = timezone.now()
    fallbacks = []
    unnest = lines._unnest_lines_pg
    monkeypatch.setattr(
        lines, "_unnest_lines_pg", lambda *a, **kw: fallbacks.append(1) or unnest(*a, **kw)
    )
    copied, fallen_back = line_prefix("copied", 0), line_prefix("fallback", 0)
    assert insert_lines(batch, prefix=copied, recorded_at=now) == 4
    assert insert_lines(batch[-1:], prefix=fallen_back, recorded_at=now) == 1
    assert insert_lines(batch, prefix=fallen_back, recorded_at=now) == 3  # one was there
    assert len(fallbacks) == (1 if connection.vendor == "postgresql" else 0)
    rows = _rows_of(copied)
    assert rows == _rows_of(fallen_back)
    assert {row[9] for row in rows} == {None, "192.0.2.7", "198.51.100.4"}
    assert {row[10] for row in rows} == {None, "2001:db8::1"}
    assert [row[11] for row in rows] == [None, ["b1", "b2"], None, None]
    assert RecoveryEvent.objects.filter(source_line__startswith=fallen_back).count() == 4
    if sql.deferred(connection):
        sql.catch_up(connection)
    counts = _day_counts()
    assert sum(events for _, events in counts) == 8
    assert all(events % 2 == 0 for _, events in counts)  # each line twice, once per prefix
    sql.rebuild(connection.alias)  # recounted from the events: the same
    assert _day_counts() == counts
    found = _search("needle")
    assert len(found) == 6
    assert [key for key in found if key.startswith(copied)] == [
        key.replace(fallen_back, copied) for key in found if key.startswith(fallen_back)
    ]


def test_insert_lines__an_object_count_without_usable_objects_is_kept():
    odd = parse_line(b'{"type": "x", "objects": [1, 2, 3]}')
    insert_lines([(0, 1, odd)], prefix=line_prefix("t", 0), recorded_at=timezone.now())
    event = RecoveryEvent.objects.get()
    assert (event.object_count, event.object_ids) == (3, None)


def test_ingest__a_lost_cursor_replays_the_file_without_duplicates(events_file):
    write(events_file, jsonl(*({"type": "backup-created", "detail": str(n)} for n in range(20))))
    ingest(events_file)
    IngestCursor.objects.all().delete()  # e.g. restored from an older backup
    job = ingest(events_file)
    assert summary(job)["duplicates"] == 20
    assert RecoveryEvent.objects.filter(source_line__isnull=False).count() == 20
    keys = Counter(RecoveryEvent.objects.values_list("source_line", flat=True))
    assert set(keys.values()) == {1}


def test_advance_cursor__refuses_a_position_another_ingest_moved_past(events_file):
    cursor = follow(str(events_file), Position.fresh("1:2"))
    start = position_of(cursor)
    mine = replace(start, offset=100)
    theirs = replace(start, offset=200)
    assert advance_cursor(cursor.pk, start, theirs)
    assert not advance_cursor(cursor.pk, start, mine)  # stale: it expected the start
    assert position_of(IngestCursor.objects.get(pk=cursor.pk)).offset == 200


def test_ingest__starting_it_by_hand_is_privileged_and_one_per_name(events_file):
    operation = get_operation("recovery.ingest")
    assert operation.access == Access.PRIVILEGED  # its input names a file on the server
    assert not may_start(operation, privileged=False)
    assert may_start(operation, privileged=True)
    # Every way of enqueueing it agrees on one unfinished job per name.
    first = jobs.enqueue("recovery.ingest", {"path": str(events_file)})
    again = jobs.enqueue(
        "recovery.ingest", {"path": str(events_file.parent / "." / "recovery-events.jsonl")}
    )
    assert (again.pk, again.created) == (first.pk, False)
