"""Import formats: records (lines, multi-line CSV rows), headers, rows as events, our export."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from recovery.imports.formats import (
    CSV_COLUMNS,
    MALFORMED_CSV,
    TOO_LONG,
    WRONG_FIELD_COUNT,
    Record,
    count_batches,
    export_line,
    export_row,
    parse_csv_record,
    parse_header,
    parse_records,
    read_record,
    read_records,
)
from recovery.parsing import LineEvent, Skip, parse_line


def records(data: bytes, *, quoted: bool, limit: int = 100) -> list[tuple[int, object]]:
    found, end = read_records(
        io.BytesIO(data), 0, quoted=quoted, limit=limit, max_records=1000, max_bytes=1 << 20
    )
    assert end == len(data)
    return [(record.offset, record.raw) for record in found]


# --- records -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"a\nb\n", [(0, b"a"), (2, b"b")]),
        (b"a\r\nb", [(0, b"a"), (3, b"b")]),  # CRLF; a last line without its newline
        (b"\n\nx\n", [(0, b""), (1, b""), (2, b"x")]),  # blank lines are records (skipped later)
        (b'"not\nquoted in jsonl"\n', [(0, b'"not'), (5, b'quoted in jsonl"')]),
        (b"x" * 150 + b"\nok\n", [(0, TOO_LONG), (151, b"ok")]),  # too long: skipped whole
    ],
)
def test_read_records__jsonl_lines(data, expected):
    assert records(data, quoted=False) == expected


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"a,b\n1,2\n", [(0, b"a,b"), (4, b"1,2")]),
        # a newline inside quotes does not end the row
        (b'type,detail\nx,"two\nlines"\ny,z\n', [(0, b"type,detail"), (12, b'x,"two\nlines"'),
                                                  (26, b"y,z")]),
        # escaped quotes ("") keep the count even
        (b'x,"say ""hi""\nthere"\n', [(0, b'x,"say ""hi""\nthere"')]),
        # an unterminated quote gives up past the limit and starts again at the next line
        (b'x,"open\n' + b"y" * 120 + b"\nz,1\n", [(0, TOO_LONG), (129, b"z,1")]),
    ],
)  # fmt: skip
def test_read_records__csv_rows(data, expected):
    assert records(data, quoted=True) == expected


def test_read_record__a_line_longer_than_one_read_is_consumed_whole():
    data = b"y" * 200_000 + b"\nnext\n"
    handle = io.BytesIO(data)
    assert read_record(handle, quoted=False, limit=8192) == (TOO_LONG, 200_001)
    assert read_record(handle, quoted=False, limit=8192) == (b"next", 5)
    assert read_record(handle, quoted=False, limit=8192) == (None, 0)


def test_read_records__stops_at_a_count_or_at_an_end_offset():
    data = b"".join(b"%d\n" % n for n in range(10))
    found, end = read_records(
        io.BytesIO(data), 4, quoted=False, limit=10, max_records=3, max_bytes=1 << 20
    )
    assert ([r.raw for r in found], end) == ([b"2", b"3", b"4"], 10)
    again, same = read_records(
        io.BytesIO(data), 4, quoted=False, limit=10, max_records=0, max_bytes=0, end=end
    )
    assert (again, same) == (found, end)


@pytest.mark.parametrize(
    ("data", "quoted", "max_records", "max_bytes", "skip_first", "batches"),
    [
        (b"a\nb\nc\n", False, 2, 10_000, False, 2),  # 3 lines, 2 per batch
        (b"a\nb\nc", False, 1, 10_000, False, 3),  # the last line without its newline counts
        (b"", False, 5, 10_000, False, 0),
        (b"type,detail\nx,1\ny,2\n", True, 1, 10_000, True, 2),  # a CSV header is no batch
        (b'type,detail\nx,"two\nlines"\ny,2\n', True, 1, 10_000, True, 2),  # a quoted newline
        (b"type\n", True, 1, 10_000, True, 0),  # a header alone: nothing to import
        (b"aaaa\nbbbb\ncccc\ndddd\n", False, 100, 8, False, 2),  # cut short by bytes
    ],
)
def test_count_batches__exactly_what_read_records_will_cut(
    data, quoted, max_records, max_bytes, skip_first, batches
):
    handle = io.BytesIO(data)
    assert count_batches(handle, 0, quoted=quoted, limit=1000, max_records=max_records,
                         max_bytes=max_bytes, skip_first=skip_first) == batches  # fmt: skip
    # And it is what reading them batch by batch gives.
    position, found = 0, 0
    if skip_first:
        handle.seek(0)
        position = read_record(handle, quoted=quoted, limit=1000)[1]
    while True:
        records, position = read_records(handle, position, quoted=quoted, limit=1000,
                                         max_records=max_records, max_bytes=max_bytes)  # fmt: skip
        if not records:
            break
        found += 1
    assert found == batches


# --- CSV ------------------------------------------------------------------------------------------


def test_parse_header__names_in_any_spelling_and_what_is_ignored():
    columns, ignored = parse_header(
        b"\xef\xbb\xbfType, Detail ,userId,DELETED-DATA,boardIds,extra,type"
    )
    assert columns == ["type", "detail", "user_id", "deleted_data", "object_ids", "", ""]
    assert ignored == ["extra", "type"]  # a second "type" column is ignored


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"detail,db", "no 'type' column"),
        (b"\xff\xfe", "not a readable CSV header"),
        (TOO_LONG, "longer than 64 KiB"),
    ],
)
def test_parse_header__refuses_an_unusable_header(raw, message):
    with pytest.raises(ValueError, match=message):
        parse_header(raw)


COLUMNS = ["type", "severity", "detail", "done", "deleted_data", "ipv4", "object_ids",
           "object_titles", "ts"]  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", Skip.BLANK),
        (b"   ", Skip.BLANK),
        (b"\xff,x", Skip.INVALID_UTF8),
        (b'backup-created,info,"bad "quote" here"', MALFORMED_CSV),
        (b",info,no type", Skip.NO_TYPE),
        (b"a,b,c,d,e,f,g,h,i,surplus", WRONG_FIELD_COUNT),
        (TOO_LONG, Skip.TOO_LONG),
    ],
)
def test_parse_csv_record__skips_with_the_reason(raw, expected):
    assert parse_csv_record(raw, COLUMNS) == expected


def test_parse_csv_record__a_full_row():
    raw = (b'restore-backup,WARN,"Restored, then\nchecked",false,true,::ffff:10.1.2.3,'
           b'"[""b1"",""b2""]",Board one,2026-11-30T10:00:00Z')  # fmt: skip
    event = parse_csv_record(raw, COLUMNS)
    assert isinstance(event, LineEvent)
    assert (event.type, event.severity, event.detail) == (
        "restore-backup",
        "warning",
        "Restored, then\nchecked",
    )
    assert (event.done, event.deleted_data, event.ipv4) == (False, True, "10.1.2.3")
    assert (list(event.object_ids), list(event.object_titles)) == (
        ["b1", "b2"],
        ["Board one", "(unknown title)"],
    )
    assert event.ts == datetime(2026, 11, 30, 10, tzinfo=UTC)
    assert event.source == "startup"  # missing means startup, as in the JSONL format


def test_parse_csv_record__fewer_cells_than_columns_is_fine():
    event = parse_csv_record(b"integrity-ok", COLUMNS)
    assert (event.type, event.done, event.object_ids) == ("integrity-ok", None, ())


def test_parse_records__counts_skips_and_keeps_each_records_identity():
    batch = parse_records(
        [Record(0, b'{"type":"a"}'), Record(13, b"nope"), Record(18, TOO_LONG), Record(40, b"")],
        columns=None,
    )
    assert [(offset, event.type) for offset, _, event in batch.events] == [(0, "a")]
    assert batch.skipped == {"malformed_json": 1, "too_long": 1, "blank": 1}


# --- our export imports unchanged ---------------------------------------------------------


EVENT = SimpleNamespace(
    type="board-permanently-deleted",
    severity="warning",
    source="admin-panel",
    db="wekan",
    detail='Deleted "Roadmap", with a comma, and\na newline',
    ts=datetime(2026, 11, 30, 10, 0, 5, tzinfo=UTC),
    done=True,
    deleted_data=True,
    user_id="u1",
    username="alice",
    ipv4="203.0.113.9",
    ipv6="2001:db8::1",
    object_ids=["b1", "b2"],
    object_titles=["Roadmap", "Ideas"],
)


def _fields(event: LineEvent) -> tuple:
    return (event.type, event.severity, event.source, event.db, event.detail, event.done,
            event.deleted_data, event.user_id, event.username, event.ipv4, event.ipv6,
            list(event.object_ids), list(event.object_titles), event.ts)  # fmt: skip


EXPECTED = (
    "board-permanently-deleted", "warning", "admin-panel", "wekan",
    'Deleted "Roadmap", with a comma, and\na newline', True, True, "u1", "alice",
    "203.0.113.9", "2001:db8::1", ["b1", "b2"], ["Roadmap", "Ideas"],
    datetime(2026, 11, 30, 10, 0, 5, tzinfo=UTC),
)  # fmt: skip


def test_export__csv_round_trip():
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerow(export_row(EVENT))
    found = records(out.getvalue().encode(), quoted=True, limit=65536)
    columns, ignored = parse_header(found[0][1])
    assert ignored == []
    assert _fields(parse_csv_record(found[1][1], columns)) == EXPECTED


def test_export__jsonl_round_trip():
    line = export_line(EVENT)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert _fields(parse_line(line[:-1])) == EXPECTED
