"""When occurrences fall, and what a tick does after downtime: table tests, no clock reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from durable.schedules.timing import (
    MAX_COUNTED,
    ON_TIME_GRACE,
    Rule,
    describe,
    format_interval,
    normalise_cron,
    occurrence_key,
    parse_interval,
    plan,
    time_zone,
)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


BERLIN = "Europe/Berlin"  # DST 2026: 03-29 02:00 → 03:00, 10-25 03:00 → 02:00 (local)


# --- cron expressions ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("30 3 * * *", "30 3 * * *"),
        ("  30   3 *  * * ", "30 3 * * *"),  # whitespace collapsed
        ("@daily", "0 0 * * *"),
        ("@HOURLY", "0 * * * *"),  # macros, any case
        ("@weekly", "0 0 * * 0"),
        ("*/15 8-18 * * MON-FRI", "*/15 8-18 * * MON-FRI"),
        ("0 0 L * *", "0 0 L * *"),  # last day of the month (Debian cron's extension)
    ],
)
def test_normalise_cron__accepts(given, stored):
    assert normalise_cron(given) == stored


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("", "empty"),
        ("* * * *", "has 4 fields"),
        ("0 0 1 1 * 2030", "has 6 fields"),  # no year field
        ("61 * * * *", "not a valid cron expression"),
        ("*/0 * * * *", "not a valid cron expression"),
        ("0 0 31 2 *", "not a valid cron expression"),  # 31 February never comes
        ("@reboot", "has 1 fields"),  # nothing runs "at reboot" here
        ("1 " * 150, "longer than 200"),
        (None, "is text"),
    ],
)
def test_normalise_cron__refuses_with_the_reason(given, message):
    with pytest.raises(ValueError, match=message):
        normalise_cron(given)


def test_time_zone__by_iana_name_only():
    assert time_zone("Europe/Helsinki") == ZoneInfo("Europe/Helsinki")
    for bad in ("", "Mars/Olympus", "../etc/passwd"):
        with pytest.raises(ValueError, match="time zone"):
            time_zone(bad)


def test_rule__has_exactly_one_of_cron_and_interval():
    with pytest.raises(ValueError, match="either"):
        Rule()
    with pytest.raises(ValueError, match="either"):
        Rule(cron="* * * * *", every=timedelta(minutes=1))


# --- next occurrence, DST included ----------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "after", "expected"),
    [
        # strictly after: an occurrence at exactly `after` is not the next one
        (Rule(cron="30 3 * * *"), utc(2026, 1, 1, 3, 30), utc(2026, 1, 2, 3, 30)),
        (Rule(cron="30 3 * * *"), utc(2026, 1, 1, 3, 29, 59), utc(2026, 1, 1, 3, 30)),
        # the wall clock of the schedule's zone: 03:30 in Helsinki is 01:30 UTC in winter
        (Rule(cron="30 3 * * *", zone="Europe/Helsinki"), utc(2026, 1, 1), utc(2026, 1, 1, 1, 30)),
        # ... and 00:30 UTC in summer
        (Rule(cron="30 3 * * *", zone="Europe/Helsinki"), utc(2026, 7, 1), utc(2026, 7, 1, 0, 30)),
        # spring forward: 02:30 does not exist on 03-29; it runs once, right after the jump
        # (03:00 CEST = 01:00 UTC), and at 02:30 again the next day
        (Rule(cron="30 2 * * *", zone=BERLIN), utc(2026, 3, 28, 12), utc(2026, 3, 29, 1, 0)),
        (Rule(cron="30 2 * * *", zone=BERLIN), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)),
        # fall back: 02:30 happens twice on 10-25; it runs once, at the first (CEST, 00:30 UTC)
        (Rule(cron="30 2 * * *", zone=BERLIN), utc(2026, 10, 24, 12), utc(2026, 10, 25, 0, 30)),
        (Rule(cron="30 2 * * *", zone=BERLIN), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)),
        # an hourly rule runs in both copies of the repeated hour (as Debian's cron does)
        (Rule(cron="0 * * * *", zone=BERLIN), utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 0)),
        (Rule(cron="0 * * * *", zone=BERLIN), utc(2026, 10, 25, 1, 0), utc(2026, 10, 25, 2, 0)),
        # intervals are elapsed time: no zone, no DST
        (Rule(every=timedelta(hours=1), zone=BERLIN), utc(2026, 10, 25, 0, 30),
         utc(2026, 10, 25, 1, 30)),
        (Rule(every=timedelta(seconds=0.2)), utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 0, 200000)),
    ],
)  # fmt: skip
def test_next_after(rule, after, expected):
    found = rule.next_after(after)
    assert found == expected
    assert found.tzinfo is UTC


# --- what a tick does ------------------------------------------------------------------------

HOURLY = Rule(every=timedelta(hours=1))
DAILY_0330 = Rule(cron="30 3 * * *")
T0 = utc(2026, 6, 1, 3, 30)


@pytest.mark.parametrize(
    ("rule", "due_at", "now", "catch_up", "expected"),
    [
        # on time (a heartbeat a few seconds late): run it, nothing missed
        (HOURLY, T0, T0 + timedelta(seconds=7), "latest",
         (T0, True, 0, T0 + timedelta(hours=1))),
        # workers down for 10 h: run once, for the latest; 10 earlier ones are not run
        (HOURLY, T0, T0 + timedelta(hours=10, minutes=5), "latest",
         (T0 + timedelta(hours=10), True, 10, T0 + timedelta(hours=11))),
        # a daily cron rule after three days down
        (DAILY_0330, T0, utc(2026, 6, 4, 9), "latest",
         (utc(2026, 6, 4, 3, 30), True, 3, utc(2026, 6, 5, 3, 30))),
        # skip: the latest is more than the grace late, so it is skipped too
        (DAILY_0330, T0, utc(2026, 6, 4, 9), "skip",
         (utc(2026, 6, 4, 3, 30), False, 3, utc(2026, 6, 5, 3, 30))),
        # skip, but the latest is within the grace: it runs, the older ones do not
        (HOURLY, T0, T0 + timedelta(hours=5, minutes=2), "skip",
         (T0 + timedelta(hours=5), True, 5, T0 + timedelta(hours=6))),
        # exactly at the grace still counts as on time
        (DAILY_0330, T0, T0 + ON_TIME_GRACE, "skip", (T0, True, 0, utc(2026, 6, 2, 3, 30))),
    ],
)  # fmt: skip
def test_plan(rule, due_at, now, catch_up, expected):
    decided = plan(rule, due_at, now, catch_up)
    assert (decided.latest, decided.run, decided.missed, decided.next_run_at) == expected
    assert not decided.missed_capped
    assert decided.latest <= now < decided.next_run_at


def test_plan__a_long_outage_of_a_per_minute_rule_is_counted_up_to_a_cap():
    every_minute = Rule(cron="* * * * *")
    now = T0 + timedelta(days=3, seconds=20)
    decided = plan(every_minute, T0, now)
    assert decided.missed_capped
    assert decided.missed >= MAX_COUNTED
    assert decided.latest == T0 + timedelta(days=3)  # still exactly the latest
    assert decided.next_run_at == T0 + timedelta(days=3, minutes=1)


def test_plan__refuses_a_schedule_that_is_not_due():
    with pytest.raises(ValueError, match="due"):
        plan(HOURLY, T0, T0 - timedelta(seconds=1))


def test_occurrence_key__is_the_schedule_and_the_utc_instant():
    helsinki = T0.astimezone(ZoneInfo("Europe/Helsinki"))
    assert (
        occurrence_key(7, T0)
        == occurrence_key(7, helsinki)
        == "schedule:7@2026-06-01T03:30:00.000000Z"
    )
    assert occurrence_key(8, T0) != occurrence_key(7, T0)


# --- intervals as text --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("1h", timedelta(hours=1)),
        (" 2D ", timedelta(days=2)),
        ("1w", timedelta(weeks=1)),
        ("0.5", timedelta(seconds=0.5)),
        ("60", timedelta(seconds=60)),
    ],
)
def test_parse_interval(text, expected):
    assert parse_interval(text) == expected


@pytest.mark.parametrize("text", ["", "soon", "0", "0.01s", "-5m", "400d", "nan", "inf", "1y"])
def test_parse_interval__refuses(text):
    with pytest.raises(ValueError, match="interval"):
        parse_interval(text)


@pytest.mark.parametrize(
    ("every", "text"),
    [
        (timedelta(seconds=90), "90s"),
        (timedelta(minutes=15), "15m"),
        (timedelta(hours=24), "1d"),
        (timedelta(weeks=2), "2w"),
        (timedelta(seconds=0.2), "0.2s"),
    ],
)
def test_format_interval(every, text):
    assert format_interval(every) == text


def test_describe():
    assert describe(Rule(cron="30 3 * * *", zone=BERLIN)) == "cron 30 3 * * * (Europe/Berlin)"
    assert describe(HOURLY) == "every 1h"
