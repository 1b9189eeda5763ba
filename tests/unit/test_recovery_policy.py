"""Pure decisions of the recovery app: file location, where to resume, tallies, reports."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recovery.parsing import SKIP_LABELS
from recovery.policy import (
    EMPTY_FINGERPRINT,
    MAX_ACTORS,
    Position,
    Probe,
    Verdict,
    bounded_json,
    events_file_path,
    file_tag,
    ingest_report,
    ingest_unique_key,
    line_key,
    line_prefix,
    normalise_cwe,
    plan_start,
    tally,
    verdict,
)

# --- where the file is ----------------------------------------


@pytest.mark.parametrize(
    ("configured", "environ", "expected"),
    [
        # RECOVERY_EVENTS_FILE wins over everything
        ("/srv/events.jsonl", {"WEKAN_SQLITE_DIR": "/data"}, "/srv/events.jsonl"),
        # WeKan's variables, in WeKan's order of preference
        ("", {"WEKAN_FERRETDB_SQLITE_DIR": "/a", "FERRETDB_SQLITE_DIR": "/b"},
         "/a/recovery-events.jsonl"),
        ("", {"FERRETDB_SQLITE_DIR": "/b", "WEKAN_SQLITE_DIR": "/c"}, "/b/recovery-events.jsonl"),
        ("", {"WEKAN_SQLITE_DIR": "/c/"}, "/c/recovery-events.jsonl"),
        # blank values count as unset
        ("  ", {"WEKAN_FERRETDB_SQLITE_DIR": " ", "WEKAN_SQLITE_DIR": "/c"},
         "/c/recovery-events.jsonl"),
        # nothing configured: no automatic ingest
        ("", {}, None),
        (None, {"HOME": "/root"}, None),
    ],
)  # fmt: skip
def test_events_file_path(configured, environ, expected):
    assert events_file_path(configured, environ) == expected


@pytest.mark.parametrize(
    ("configured", "environ", "expected"),
    [
        # relative to the project directory, not to the current directory
        ("var/events.jsonl", {}, "/srv/app/var/events.jsonl"),
        ("../shared/events.jsonl", {}, "/srv/shared/events.jsonl"),
        ("", {"WEKAN_SQLITE_DIR": "data"}, "/srv/app/data/recovery-events.jsonl"),
        # absolute paths are left alone (normalised)
        ("/var/lib//wekan/./events.jsonl", {}, "/var/lib/wekan/events.jsonl"),
    ],
)
def test_events_file_path__relative_to_the_project_directory(configured, environ, expected):
    assert events_file_path(configured, environ, base="/srv/app") == expected


def test_ingest_unique_key__bounded_for_long_paths():
    assert ingest_unique_key("/x.jsonl") == "recovery-ingest:/x.jsonl"
    long = "/" + "d" * 400 + "/recovery-events.jsonl"
    key = ingest_unique_key(long)
    assert len(key) <= 255
    assert key != ingest_unique_key(long + "x")


def test_line_key__changes_with_every_part_of_the_identity():
    base = line_key(line_prefix("t", 0), 100, 0xABC)
    assert base == "t:0:000000000064:00000abc"
    others = {line_key(line_prefix("u", 0), 100, 0xABC), line_key(line_prefix("t", 1), 100, 0xABC)}
    others |= {line_key(line_prefix("t", 0), 101, 0xABC), line_key(line_prefix("t", 0), 100, 0xABD)}
    assert base not in others
    assert len(line_key(line_prefix("0123456789", 4_000_000_000), 10**12, 0xFFFFFFFF)) <= 64


def test_line_key__sorts_in_file_order():
    keys = [line_key(line_prefix("t", 2), offset, 0) for offset in (9, 10, 4096, 10**9)]
    assert keys == sorted(keys)


# --- where to resume ----------------------------------------

SAVED = Position(file_id="1:10", generation=3, offset=500, head="H", tail="T", crc=77, tag="t")


def probe(file_id="1:10", size=800, head="H", tail="T") -> Probe:
    return Probe(file_id=file_id, size=size, head=head, tail=tail)


@pytest.mark.parametrize(
    ("saved", "seen", "expected"),
    [
        # nothing read yet: whatever is there is first
        (Position(), probe(file_id="9:9"), Verdict.FIRST),
        # same file, grown: read on
        (SAVED, probe(), Verdict.CONTINUE),
        # same file, not grown: read on (nothing to read)
        (SAVED, probe(size=500), Verdict.CONTINUE),
        # same file, shorter than what was read
        (SAVED, probe(size=499, head=None, tail=None), Verdict.TRUNCATED),
        # same inode, first bytes changed
        (SAVED, probe(head="other"), Verdict.REWRITTEN),
        # same inode, bytes before the offset changed
        (SAVED, probe(tail="other"), Verdict.REWRITTEN),
        # another inode at the path, even with identical bytes
        (SAVED, probe(file_id="1:11"), Verdict.REPLACED),
        # stopped inside an over-long line: read on, still discarding it
        (
            Position(file_id="1:10", offset=700, skipping=True, head="H", tail="T"),
            probe(),
            Verdict.CONTINUE,
        ),
    ],
)
def test_verdict(saved, seen, expected):
    assert verdict(saved, seen) is expected


def test_file_tag__names_the_file_and_generation_never_the_path():
    tag = file_tag("2049:1234", 0)
    assert len(tag) == 10
    assert tag == file_tag("2049:1234", 0)  # stable: a lost cursor replays into the same keys
    assert tag != file_tag("2049:1234", 1)  # a file started again is new
    assert tag != file_tag("2049:1235", 0)  # another file is another file
    assert Position.fresh("2049:1234") == Position(file_id="2049:1234", tag=tag)
    assert Position.fresh("2049:1234").prefix == f"{tag}:0:"


def test_restart__a_new_generation_with_a_tag_of_its_own():
    again = SAVED.restart()
    assert again == Position(file_id="1:10", generation=4, tag=file_tag("1:10", 4))
    assert again.prefix != SAVED.prefix


def test_plan_start__first_read_of_a_new_file_starts_fresh():
    plan = plan_start(Position(), probe(file_id="5:5"))
    assert plan.verdict is Verdict.FIRST
    assert plan.start == Position.fresh("5:5")
    assert plan.note == ""


def test_plan_start__first_read_of_a_file_just_followed_keeps_its_identity():
    followed = Position(file_id="5:5", generation=2, tag="kept")
    assert plan_start(followed, probe(file_id="5:5")).start == followed


def test_plan_start__continue_keeps_the_position():
    assert plan_start(SAVED, probe()).start == SAVED


@pytest.mark.parametrize(
    ("seen", "note"),
    [
        (probe(size=10, head=None, tail=None), "truncated"),
        (probe(head="other"), "rewritten"),
    ],
)
def test_plan_start__the_same_file_changed_is_read_from_its_start_as_a_new_generation(seen, note):
    plan = plan_start(SAVED, seen)
    assert plan.start == SAVED.restart()
    assert plan.start.offset == 0
    assert plan.start.head == EMPTY_FINGERPRINT
    assert note in plan.note
    assert "copytruncate" not in plan.note


@pytest.mark.parametrize("seen", [probe(size=10, head=None, tail=None), probe(head="other")])
def test_plan_start__after_finishing_its_copy_a_truncated_file_starts_again(seen):
    plan = plan_start(SAVED, seen, drained="/var/log/recovery-events.jsonl.1")
    assert plan.start == SAVED.restart()
    assert "the rest of its copy /var/log/recovery-events.jsonl.1 was read first" in plan.note
    assert "copytruncate" in plan.note


def test_plan_start__a_new_file_at_the_path_is_fresh():
    plan = plan_start(SAVED, probe(file_id="2:20"))
    assert plan.verdict is Verdict.REPLACED
    assert plan.start == Position.fresh("2:20")
    assert "replaced by a new one" in plan.note


def test_plan_start__after_draining_the_rotated_file_the_new_one_starts_fresh():
    drained = Position(file_id="1:10", generation=3, offset=900, head="H", tail="T2", crc=5)
    plan = plan_start(drained, probe(file_id="2:20", size=50), drained="x.1")
    assert plan.start == Position.fresh("2:20")
    assert "rotated" in plan.note


@pytest.mark.parametrize(
    ("seen", "prefix_crc", "continues"),
    [
        # a copy of the old bytes plus more: read on from the offset, as the old lines
        (probe(file_id="2:20", size=600), 77, True),
        (probe(file_id="2:20", size=500), 77, True),
        # identical first bytes but something before the offset differs
        (probe(file_id="2:20", size=600), 78, False),
        (probe(file_id="2:20", size=600, tail="x"), 77, False),
        # identical first line, shorter file
        (probe(file_id="2:20", size=499, tail=None), None, False),
        # crc not computed (first bytes already differ)
        (probe(file_id="2:20", head="x"), None, False),
    ],
)
def test_plan_start__a_replacement_is_continued_only_with_the_same_prefix(
    seen, prefix_crc, continues
):
    plan = plan_start(SAVED, seen, prefix_crc=prefix_crc)
    assert plan.verdict is Verdict.REPLACED
    if continues:
        # The same line identity (tag, generation) as the old file: a line it
        # repeats is the line already imported, whichever file it was read from.
        assert plan.start == Position(
            file_id="2:20", generation=3, offset=500, head="H", tail="T", crc=77, tag="t"
        )
        assert "same first 500 bytes" in plan.note
    else:
        assert plan.start == Position.fresh("2:20")


# --- Security rows ----------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (918, "CWE-918"),
        ("918", "CWE-918"),
        ("CWE-918", "CWE-918"),
        ("cwe_79", "CWE-79"),
        (" cwe 352 ", "CWE-352"),
        ("", ""),
        (None, ""),
        (True, ""),
        (-5, ""),
        ("OWASP A10 and a very long label", "OWASP A10 and a "),
    ],
)
def test_normalise_cwe(given, expected):
    assert normalise_cwe(given) == expected


def test_tally__counts_known_actors_and_caps_new_ones():
    counts: dict[str, int] = {}
    overflow = 0
    for n in range(MAX_ACTORS + 10):
        counts, extra = tally(counts, f"user{n}")
        overflow += extra
    counts, extra = tally(counts, "user0")  # known: still counted by name
    overflow += extra
    assert len(counts) == MAX_ACTORS
    assert counts["user0"] == 2
    assert overflow == 10
    assert tally(counts, "") == (counts, 0)  # anonymous: not tallied


def test_tally__does_not_change_its_input():
    before = {"alice": 1}
    after, _ = tally(before, "alice")
    assert before == {"alice": 1}
    assert after == {"alice": 2}


@given(st.lists(st.text(max_size=3), max_size=200))
def test_tally__never_more_than_the_cap_and_nothing_lost(actors):
    counts: dict[str, int] = {}
    overflow = 0
    for actor in actors:
        counts, extra = tally(counts, actor, cap=5)
        overflow += extra
    assert len(counts) <= 5
    assert sum(counts.values()) + overflow == sum(1 for actor in actors if actor)


# --- reports ----------------------------------------


def test_bounded_json__keeps_small_values_and_marks_big_ones():
    assert bounded_json({"next": 3}) == {"next": 3}
    assert bounded_json(None) is None
    big = bounded_json({"ids": list(range(5000))}, limit=200)
    assert set(big) == {"truncated"}
    assert len(big["truncated"].encode()) <= 200


def test_ingest_report__nothing_worth_saying():
    report = ingest_report(
        "/f", imported=5, lines=7, skipped={"blank": 2}, first_skipped={"blank": 3},
        ips_dropped=0, notes=[], labels=SKIP_LABELS,
    )  # fmt: skip
    assert report is None


def test_ingest_report__counts_each_reason_with_its_first_offset():
    severity, detail = ingest_report(
        "/var/wekan/recovery-events.jsonl",
        imported=1000,
        lines=1004,
        skipped={"malformed_json": 2, "too_long": 1, "blank": 1},
        first_skipped={"malformed_json": 1234, "too_long": 99, "blank": 0},
        ips_dropped=3,
        notes=["the file was truncated (now 10 bytes, 500 were read)"],
        labels=SKIP_LABELS,
    )
    assert severity == "warning"
    assert detail.startswith("Imported 1,000 of 1,004 lines from /var/wekan/recovery-events.jsonl.")
    assert "Skipped 3: 2 malformed JSON (first at byte 1,234), 1 longer than 8 KiB" in detail
    assert "Dropped 3 invalid IP address(es)." in detail
    assert detail.endswith("The file was truncated (now 10 bytes, 500 were read).")


def test_ingest_report__a_file_change_alone_is_info():
    severity, detail = ingest_report(
        "/f", imported=2, lines=2, skipped={}, first_skipped={}, ips_dropped=0,
        notes=["the file was replaced by a new one"], labels=SKIP_LABELS,
    )  # fmt: skip
    assert severity == "info"
    assert "replaced" in detail
