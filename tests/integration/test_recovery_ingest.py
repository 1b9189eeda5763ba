"""The recovery-events.jsonl ingest on real files, run in the test's own thread.

Subprocess workers (append while a worker runs, SIGKILL, two workers) are in
``test_recovery_workers.py``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from django.utils import timezone

from durable.models import Job, UnitResult
from recovery.models import EventType, IngestCursor, RecoveryEvent
from recovery.parsing import parse_line
from recovery.policy import Position, line_key, line_prefix
from recovery.receivers import enqueue_ingest
from recovery.records import advance_cursor, cursor_for, insert_lines, position_of

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
    return UnitResult.objects.get(job=job, key="summary").result["summary"]


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
    cursor = IngestCursor.objects.get(path=str(events_file))
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


def test_ingest__batches_are_units_and_the_checkpoint_is_offset_plus_identity(events_file):
    write(events_file, jsonl(*({"type": f"t{n}"} for n in range(5))))
    job = ingest(events_file, batch_lines=2)
    assert [unit["lines"] for unit in line_units(job)] == [2, 2, 1]
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
    cursor = IngestCursor.objects.get(path=str(events_file))
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
    assert IngestCursor.objects.get(path=str(events_file)).generation == 1


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


def test_ingest__a_copy_with_more_lines_replacing_the_file_continues_where_it_was(events_file):
    old = jsonl({"type": "integrity-ok"}, {"type": "backup-created"})
    write(events_file, old)
    ingest(events_file)
    replacement = events_file.with_name("tmp")  # a writer that rewrites via a temporary copy
    write(replacement, old + jsonl({"type": "restore-backup"}))
    os.replace(replacement, events_file)
    ingest(events_file)
    assert types() == ["integrity-ok", "backup-created", "restore-backup"]
    assert "same first" in report().detail


def test_ingest__a_missing_file_completes_with_nothing_to_do(events_file):
    job = ingest(events_file)
    assert job.events.filter(kind="nothing_to_import").exists()
    assert not RecoveryEvent.objects.exists()


def test_ingest__a_directory_fails_with_a_clear_reason(tmp_path):
    job = enqueue_ingest(str(tmp_path))
    job = drain(job.pk)
    assert job.state == "failed"
    assert "is not a regular file" in job.reason


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
    cursor = cursor_for(str(events_file))
    start = position_of(cursor)
    mine = Position(file_id="1:2", offset=100)
    theirs = Position(file_id="1:2", offset=200)
    assert advance_cursor(cursor.pk, start, theirs)
    assert not advance_cursor(cursor.pk, start, mine)  # stale: it expected the start
    assert position_of(IngestCursor.objects.get(pk=cursor.pk)).offset == 200
