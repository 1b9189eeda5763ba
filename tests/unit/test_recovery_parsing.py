"""The recovery-events.jsonl line parser: tables, then properties (hypothesis)."""

from __future__ import annotations

import gc
import json
import threading
import zlib
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.parsing import (
    MAX_LINE_BYTES,
    MAX_OBJECT_ID_CHARS,
    MAX_OBJECTS,
    PARSE_AHEAD_THREAD,
    SEVERITIES,
    UNKNOWN_TITLE,
    LineEvent,
    Skip,
    bound_objects,
    frame_chunk,
    normalise_severity,
    parse_bool,
    parse_chunk,
    parse_line,
    parse_ts,
    split_addresses,
)

EXAMPLE = (
    b'{"type":"backup-created","db":"wekan","severity":"info","source":"startup",'
    b'"detail":"Backed up wekan.sqlite to backup/","ts":"2026-11-30T10:00:00Z"}'
)


def line(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def event(raw: bytes) -> LineEvent:
    parsed = parse_line(raw)
    assert isinstance(parsed, LineEvent), parsed
    return parsed


# --- whole lines ----------------------------------------


def test_parse_line__the_spec_example():
    parsed = event(EXAMPLE)
    assert parsed.type == "backup-created"
    assert (parsed.db, parsed.severity, parsed.source) == ("wekan", "info", "startup")
    assert parsed.detail == "Backed up wekan.sqlite to backup/"
    assert parsed.ts == datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    assert parsed.done is None  # not said: the report shows it as done
    assert (list(parsed.object_ids), list(parsed.object_titles), parsed.object_count) == ([], [], 0)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", Skip.BLANK),
        (b"   \t ", Skip.BLANK),
        (b"\r", Skip.BLANK),  # an empty CRLF line
        (b"\xef\xbb\xbf", Skip.BLANK),  # only a BOM
        (b"{not json", Skip.MALFORMED),
        (b'{"type": "x"', Skip.MALFORMED),  # cut short
        (b"[" * 5000 + b"]" * 5000, Skip.TOO_LONG),
        (b"[" * 4000 + b"]" * 4000, Skip.MALFORMED),  # nested deeper than json allows
        (b"[1, 2]", Skip.NOT_OBJECT),
        (b'"backup-created"', Skip.NOT_OBJECT),
        (b"42", Skip.NOT_OBJECT),
        (b"null", Skip.NOT_OBJECT),
        (b'{"db": "wekan"}', Skip.NO_TYPE),
        (b'{"type": ""}', Skip.NO_TYPE),
        (b'{"type": "   "}', Skip.NO_TYPE),  # whitespace only
        (b'{"type": "\\u0000"}', Skip.NO_TYPE),  # only a NUL, which is removed
        (b'{"type": 7}', Skip.NO_TYPE),  # a type must be text
        (b'{"type": null}', Skip.NO_TYPE),
        (b'{"type": "x", "detail": "caf\xe9"}', Skip.INVALID_UTF8),  # Latin-1 é
        (b'{"type": "\xff\xfe"}', Skip.INVALID_UTF8),
    ],
)
def test_parse_line__skips_with_a_reason(raw, reason):
    assert parse_line(raw) is reason


def test_parse_line__length_limit_is_8_kib_of_bytes():
    padding = MAX_LINE_BYTES - len(b'{"type":"x","detail":""}')
    exact = b'{"type":"x","detail":"' + b"a" * padding + b'"}'
    assert len(exact) == MAX_LINE_BYTES
    assert event(exact).type == "x"
    assert event(exact + b"\r").type == "x"  # the CR of a CRLF does not count
    longer = b'{"type":"x","detail":"' + b"a" * (padding + 1) + b'"}'
    assert parse_line(longer) is Skip.TOO_LONG


def test_parse_line__accepts_crlf_bom_and_surrounding_spaces():
    assert event(EXAMPLE + b"\r").type == "backup-created"
    assert event(b"\xef\xbb\xbf" + EXAMPLE).type == "backup-created"
    assert event(b"  \xef\xbb\xbf " + EXAMPLE + b"  \r").type == "backup-created"


def test_parse_line__empty_or_bad_ts_is_no_time_not_a_skip():
    assert event(line(type="x", ts="")).ts is None
    assert event(line(type="x", ts="yesterday")).ts is None
    assert event(line(type="x")).ts is None


def test_parse_line__cleans_text_for_the_database():
    parsed = event(line(type=" restore\u0000-backup ", detail="a\u0000b", db="\ud800wekan"))
    assert parsed.type == "restore-backup"
    assert parsed.detail == "ab"
    assert parsed.db == "?wekan"  # a lone surrogate cannot be stored; it becomes "?"
    long = event(line(type="t" * 500, detail="d" * 6000, source="s" * 100))
    assert len(long.type) == 100
    assert long.type.endswith("…")
    assert len(long.source) == 40
    assert len(long.detail.encode()) == 4096  # bounded, marked as cut


def test_parse_line__wekan_camel_case_fields():
    parsed = event(
        line(
            type="board-permanently-deleted",
            done=True,
            deletedData=True,
            userId="u1",
            username="alice",
            ipv4="203.0.113.9",
            boardIds=["b1", "b2"],
            boardTitles=["Roadmap"],
        )
    )
    assert (parsed.done, parsed.deleted_data) == (True, True)
    assert (parsed.user_id, parsed.username, parsed.ipv4) == ("u1", "alice", "203.0.113.9")
    assert parsed.object_ids == ["b1", "b2"]
    assert parsed.object_titles == ["Roadmap", UNKNOWN_TITLE]


def test_parse_line__objects_as_a_list_of_dicts():
    objects = [{"id": f"c{n}", "title": f"T{n}"} for n in range(250)]
    parsed = event(line(type="x", objects=objects))
    assert parsed.object_count == 250
    assert len(parsed.object_ids) == len(parsed.object_titles) == MAX_OBJECTS
    assert parsed.object_ids[0] == "c0"
    assert parsed.object_titles[199] == "T199"


# --- field normalisers ----------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("info", "info"),
        ("INFO", "info"),
        (" Warning ", "warning"),
        ("warn", "warning"),
        ("error", "error"),
        ("ERR", "error"),
        ("critical", "error"),
        ("fatal", "error"),
        ("", "info"),  # not said
        ("whatever", "info"),  # unknown words do not escalate
        (None, "info"),
        (3, "info"),
        (["error"], "info"),
    ],
)
def test_normalise_severity(given, expected):
    assert normalise_severity(given) == expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (True, True),
        (False, False),
        ("true", True),
        ("False", False),
        ("yes", True),
        ("0", False),
        (1, True),
        (0, False),
        (2, None),  # not a boolean: "not said", which means done
        ("maybe", None),
        (None, None),
        ([], None),
    ],
)
def test_parse_bool(given, expected):
    assert parse_bool(given) is expected


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (("203.0.113.9",), ("203.0.113.9", None, 0)),
        (("2001:DB8::1",), (None, "2001:db8::1", 0)),  # compressed, lower case
        (("::ffff:198.51.100.7",), ("198.51.100.7", None, 0)),  # IPv4-mapped → IPv4
        (("[2001:db8::2]",), (None, "2001:db8::2", 0)),
        (("fe80::1%eth0",), (None, "fe80::1", 0)),  # zone id dropped
        (("999.1.1.1",), (None, None, 1)),  # invalid: dropped and counted
        (("not an ip", "2001:db8::3"), (None, "2001:db8::3", 1)),
        ((None, "", "10.0.0.1"), ("10.0.0.1", None, 0)),  # absent is not invalid
        (("10.0.0.1", "10.0.0.2"), ("10.0.0.1", None, 0)),  # first of a family wins
        ((12345,), (None, None, 1)),
    ],
)
def test_split_addresses(values, expected):
    assert split_addresses(*values) == expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("2026-11-30T10:00:00Z", datetime(2026, 11, 30, 10, 0, tzinfo=UTC)),
        ("2026-11-30T12:00:00+02:00", datetime(2026, 11, 30, 10, 0, tzinfo=UTC)),
        ("2026-11-30 10:00:00", datetime(2026, 11, 30, 10, 0, tzinfo=UTC)),  # naive = UTC
        ("2026-11-30", datetime(2026, 11, 30, tzinfo=UTC)),
        (1796205600, datetime(2026, 12, 2, 10, 0, tzinfo=UTC)),  # epoch seconds
        (1796205600000, datetime(2026, 12, 2, 10, 0, tzinfo=UTC)),  # epoch milliseconds
        # quoted epoch, as WeKan's launch scripts write every value
        ("1796205600", datetime(2026, 12, 2, 10, 0, tzinfo=UTC)),
        (" 1796205600000 ", datetime(2026, 12, 2, 10, 0, tzinfo=UTC)),
        ("1796205600.5", datetime(2026, 12, 2, 10, 0, 0, 500000, tzinfo=UTC)),
        ("1e300", None),
        ("99999999999999999", None),  # too many digits: not a time
        ("", None),
        ("  ", None),
        ("30/11/2026", None),
        (True, None),
        (1e300, None),  # out of range
        (None, None),
    ],
)
def test_parse_ts(given, expected):
    assert parse_ts(given) == expected


def test_bound_objects__aligns_titles_and_keeps_the_true_count():
    ids, titles, count = bound_objects(["a", 7, None, "b"], ["A", None])
    assert ids == ["a", "7", "", "b"]
    assert titles == ["A", UNKNOWN_TITLE, UNKNOWN_TITLE, UNKNOWN_TITLE]
    assert count == 4
    ids, titles, count = bound_objects(list(range(1000)), "not a list")
    assert (len(ids), len(titles), count) == (MAX_OBJECTS, MAX_OBJECTS, 1000)
    assert bound_objects(None, None) == ([], [], 0)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (7, "7"),
        (-12, "-12"),
        (10**99, "1" + "0" * 99),  # 100 digits: fits
        (10**150, "1" + "0" * 98 + "…"),  # longer: cut like any text
        (10**5000, "…"),  # more digits than Python will print
        ("x" * 150, "x" * 99 + "…"),
        (True, ""),  # not an id
    ],
    ids=["small", "negative", "100-digits", "150-digits", "5000-digits", "long-text", "bool"],
)
def test_bound_objects__ids_are_bounded_whatever_their_type(given, expected):
    (object_id,), _, _ = bound_objects([given], [])
    assert object_id == expected
    assert len(object_id) <= MAX_OBJECT_ID_CHARS


def test_parse_line__a_huge_numeric_object_id_is_bounded():
    raw = b'{"type": "board-permanently-deleted", "boardIds": [' + b"9" * 500 + b"]}"
    event = parse_line(raw)
    assert event.object_ids == ["9" * 99 + "…"]


# --- chunks of the file ----------------------------------------


def test_parse_chunk__offsets_crcs_and_the_unfinished_last_line():
    data = EXAMPLE + b"\n\nnot json\n" + EXAMPLE + b'\r\n{"type":"unfinished'
    chunk = parse_chunk(data, offset=1000, crc=0)
    complete = len(data) - len(b'{"type":"unfinished')
    assert chunk.consumed == complete  # the last line waits for its newline
    assert chunk.crc == zlib.crc32(data[:complete])
    assert chunk.lines == 4
    assert [at for at, _, _ in chunk.events] == [1000, 1000 + len(EXAMPLE) + 11]
    # Each line's own CRC (the second line ends in CR: a line's bytes are what it is).
    assert [crc for _, crc, _ in chunk.events] == [zlib.crc32(EXAMPLE), zlib.crc32(EXAMPLE + b"\r")]
    assert dict(chunk.skipped) == {"blank": 1, "malformed_json": 1}
    assert chunk.first_skipped == {
        "blank": 1000 + len(EXAMPLE) + 1,
        "malformed_json": 1000 + len(EXAMPLE) + 2,
    }


def test_parse_chunk__crc_continues_from_the_previous_chunk():
    data = EXAMPLE + b"\n" + EXAMPLE + b"\n"
    whole = parse_chunk(data, offset=0, crc=0)
    half = len(EXAMPLE) + 1
    first = parse_chunk(data[:half], offset=0, crc=0)
    second = parse_chunk(data[half:], offset=half, crc=first.crc)
    assert second.crc == whole.crc
    assert [e[:2] for e in first.events + second.events] == [e[:2] for e in whole.events]
    assert first.events[0][1] == second.events[0][1]  # same bytes, same line CRC


def test_parse_chunk__max_lines_bounds_a_unit():
    data = b"".join(line(type=f"t{n}") + b"\n" for n in range(10))
    chunk = parse_chunk(data, offset=0, crc=0, max_lines=3)
    assert chunk.lines == 3
    assert [e.type for _, _, e in chunk.events] == ["t0", "t1", "t2"]
    assert data[: chunk.consumed].count(b"\n") == 3


def test_parse_chunk__an_over_long_partial_line_is_discarded_until_its_newline():
    huge = b'{"type":"x","detail":"' + b"y" * (MAX_LINE_BYTES + 100)
    first = parse_chunk(EXAMPLE + b"\n" + huge, offset=0, crc=0)
    assert first.skipping  # already too long: consumed, to be discarded
    assert first.consumed == len(EXAMPLE) + 1 + len(huge)
    assert len(first.events) == 1
    assert not first.skipped  # counted once, when the line ends
    rest = b'yyy"}\n' + EXAMPLE + b"\n"
    second = parse_chunk(rest, offset=first.end, crc=first.crc, skipping=True)
    assert not second.skipping
    assert dict(second.skipped) == {"too_long": 1}
    assert [e.type for _, _, e in second.events] == ["backup-created"]
    assert second.crc == zlib.crc32(EXAMPLE + b"\n" + huge + rest)


def test_parse_chunk__a_short_partial_line_is_not_consumed():
    chunk = parse_chunk(b'{"type":"x"}', offset=0, crc=0)
    assert (chunk.consumed, chunk.lines, chunk.events) == (0, 0, [])


def test_parse_chunk__final_reads_the_last_line_without_newline():
    chunk = parse_chunk(EXAMPLE + b"\n" + line(type="last"), offset=0, crc=0, final=True)
    assert [e.type for _, _, e in chunk.events] == ["backup-created", "last"]
    assert chunk.consumed == len(EXAMPLE) + 1 + len(line(type="last"))


# --- properties ----------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=20,
)
field_names = st.sampled_from(
    ["type", "db", "detail", "severity", "source", "ts", "done", "deleted_data", "deletedData",
     "user_id", "userId", "username", "ip", "ipv4", "ipv6", "object_ids", "object_titles",
     "boardIds", "boardTitles", "objects"]
)  # fmt: skip
event_objects = st.dictionaries(field_names | st.text(max_size=8), json_values, max_size=12)


def assert_fit_for_the_database(parsed: LineEvent) -> None:
    assert parsed.type.strip() == parsed.type != ""
    assert parsed.severity in SEVERITIES
    assert parsed.done in (True, False, None)
    assert isinstance(parsed.deleted_data, bool)
    texts = [parsed.type, parsed.db, parsed.detail, parsed.source, parsed.user_id, parsed.username]
    texts += parsed.object_ids + parsed.object_titles
    for text in texts:
        assert "\x00" not in text
        text.encode("utf-8")  # no lone surrogates
    assert len(parsed.object_ids) == len(parsed.object_titles) <= MAX_OBJECTS
    assert parsed.object_count >= len(parsed.object_ids)
    assert parsed.ts is None or parsed.ts.tzinfo is not None


@given(st.binary(max_size=400))
def test_parse_line__never_raises_on_any_bytes(raw):
    parsed = parse_line(raw)
    assert isinstance(parsed, Skip | LineEvent)
    if isinstance(parsed, LineEvent):
        assert_fit_for_the_database(parsed)


@settings(max_examples=300)
@given(event_objects)
def test_parse_line__any_json_object_gives_a_clean_event_or_a_reason(obj):
    parsed = parse_line(json.dumps(obj).encode())
    assert isinstance(parsed, Skip | LineEvent)
    if isinstance(parsed, LineEvent):
        assert_fit_for_the_database(parsed)
    else:
        assert parsed in (Skip.NO_TYPE, Skip.TOO_LONG)


@given(
    st.lists(st.binary(max_size=60) | st.just(EXAMPLE), max_size=20),
    st.integers(1, 50),
    st.booleans(),
)
def test_parse_chunk__accounts_for_every_line_exactly_once(pieces, max_lines, final):
    data = b"\n".join(pieces)
    chunk = parse_chunk(data, offset=0, crc=0, max_lines=max_lines, final=final)
    consumed = data[: chunk.consumed]
    if chunk.consumed < len(data):
        assert consumed == b"" or consumed.endswith(b"\n")  # stopped at a line's end
        assert not final or chunk.lines == max_lines  # a rotated file is read to its end
    unterminated = consumed != b"" and not consumed.endswith(b"\n")
    assert chunk.lines == consumed.count(b"\n") + unterminated <= max_lines
    assert len(chunk.events) + sum(chunk.skipped.values()) == chunk.lines
    assert chunk.crc == zlib.crc32(consumed)
    for offset, crc, parsed in chunk.events:
        assert offset == 0 or data[offset - 1 : offset] == b"\n"
        end = data.find(b"\n", offset)
        assert crc == zlib.crc32(data[offset : end if end >= 0 else len(data)])
        assert_fit_for_the_database(parsed)


@given(
    st.lists(st.binary(max_size=60) | st.just(EXAMPLE) | st.just(b"x" * 9000), max_size=30),
    st.integers(1, 50),
    st.booleans(),
    st.booleans(),
    st.integers(1, 7),
)
def test_frame_then_parsed_ahead__finds_exactly_what_parse_chunk_finds(
    pieces, max_lines, final, skipping, step_lines
):
    """Events, skip counts, first skips and dropped addresses, step by step on a thread."""
    data = b"\n".join(pieces)
    options = {"offset": 500, "crc": 7, "skipping": skipping, "max_lines": max_lines}
    whole = parse_chunk(data, final=final, **options)
    framed = frame_chunk(data, final=final, **options)
    assert (framed.consumed, framed.crc, framed.skipping, framed.lines) == (
        whole.consumed, whole.crc, whole.skipping, whole.lines,
    )  # fmt: skip
    steps = list(framed.parsed(step_lines))
    assert [event for step in steps for event in step] == whole.events == framed.events
    assert all(len(step) <= step_lines for step in steps)
    assert (framed.skipped, framed.first_skipped, framed.ips_dropped) == (
        whole.skipped, whole.first_skipped, whole.ips_dropped,
    )  # fmt: skip
    list(framed.parsed(step_lines))  # read again: the same, not twice as much
    assert (framed.events, framed.skipped) == (whole.events, whole.skipped)


def test_parsed__its_thread_ends_with_it_when_the_caller_stops_early():
    data = b"".join([EXAMPLE + b"\n", b"not json\n"] * 50)
    chunk = frame_chunk(data, offset=0, crc=0, max_lines=1_000)
    steps = chunk.parsed(step_lines=10)
    assert len(next(steps)) == 5
    assert any(t.name.startswith(PARSE_AHEAD_THREAD) for t in threading.enumerate())
    steps.close()  # e.g. the insert failed: contextlib.closing in the ingest
    assert not any(t.name.startswith(PARSE_AHEAD_THREAD) for t in threading.enumerate())
    assert (len(chunk.events), chunk.skipped["malformed_json"]) == (5, 5)  # what was read


@pytest.mark.parametrize("enabled", [True, False])
def test_parse_chunk__leaves_the_cycle_collector_as_it_found_it(enabled):
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        chunk = parse_chunk(EXAMPLE + b"\n" + EXAMPLE + b"\n", offset=0, crc=0)
        assert len(chunk.events) == 2
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
