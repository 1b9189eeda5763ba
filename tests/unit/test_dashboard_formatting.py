"""How the dashboard words times, tallies, numbers; the chart's geometry."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from recovery.dashboard.chart import chart, last_days, nice_ceiling, short_number
from recovery.dashboard.formatting import actor_tally, excerpt, number, percent, relative_time

NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)

# --- relative time ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(0), "now"),
        (timedelta(milliseconds=900), "now"),  # under a second either way
        (timedelta(seconds=-5), "5 s ago"),
        (timedelta(seconds=5.9), "in 5 s"),  # rounded down: never promises too early
        (timedelta(seconds=119), "in 1 min"),
        (timedelta(minutes=-59, seconds=-59), "59 min ago"),
        (timedelta(hours=-1), "1 h ago"),
        (timedelta(hours=23, minutes=59), "in 23 h"),
        (timedelta(days=-3, hours=-5), "3 d ago"),
        (timedelta(days=29), "in 29 d"),
        (timedelta(days=-30), "2026-11-02"),  # far away: the date
        (timedelta(days=400), "2028-01-06"),
    ],
)  # fmt: skip
def test_relative_time(delta, text):
    assert relative_time(NOW + delta, NOW) == text


def test_relative_time__none_is_a_dash():
    assert relative_time(None, NOW) == "—"


# --- tallies ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("users", "users_over", "addresses", "addresses_over", "text"),
    [
        # the example from the issue: one user, one address, the rest counted
        ({"alice": 25}, 0, {"203.0.113.9": 30, "198.51.100.1": 2}, 9_410,
         "alice 25, 203.0.113.9 30, and 9,412 others"),
        # busiest first, ties by name
        ({"bob": 3, "alice": 3, "carol": 1}, 0, {}, 0, "alice 3, and 4 others"),
        # nothing beyond what is shown: no "others"
        ({"alice": 2}, 0, {"10.0.0.1": 2}, 0, "alice 2, 10.0.0.1 2"),
        # the remainders overlap (a refusal names both): the larger is reported, not the sum
        ({"alice": 5, "bob": 7}, 0, {"10.0.0.1": 6, "10.0.0.2": 6}, 0,
         "bob 7, 10.0.0.1 6, and 6 others"),
        # only overflow (every name beyond the cap)
        ({}, 12, {}, 0, "12 others"),
        ({}, 0, {}, 0, "—"),
        (None, 0, None, 0, "—"),
    ],
)  # fmt: skip
def test_actor_tally(users, users_over, addresses, addresses_over, text):
    assert actor_tally(users, users_over, addresses, addresses_over) == text


def test_actor_tally__more_shown_on_request():
    text = actor_tally({"a": 3, "b": 2, "c": 1}, 0, {}, 0, shown=2)
    assert text == "a 3, b 2, and 1 others"


# --- small formats -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "limit", "out"),
    [
        ("short", 10, "short"),
        ("  many   spaces\nand lines ", 40, "many spaces and lines"),
        ("abcdefghij", 5, "abcd…"),
        (None, 5, ""),
    ],
)
def test_excerpt(text, limit, out):
    assert excerpt(text, limit) == out


@pytest.mark.parametrize(
    ("done", "total", "out"),
    [(0, 10, 0), (5, 10, 50), (10, 10, 100), (11, 10, 100), (1, 3, 33), (3, None, None),
     (3, 0, None)],
)  # fmt: skip
def test_percent(done, total, out):
    assert percent(done, total) == out


def test_number():
    assert number(9412) == "9,412"
    assert number(None) == "—"


# --- the chart ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ceiling"),
    [(0, 1), (1, 1), (2, 2), (3, 5), (5, 5), (6, 10), (11, 20), (21, 50), (51, 100),
     (101, 200), (99_999, 100_000), (123_456, 200_000)],
)  # fmt: skip
def test_nice_ceiling(value, ceiling):
    assert nice_ceiling(value) == ceiling


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (950, "950"), (1000, "1k"), (1500, "1.5k"), (20_000, "20k"), (3_000_000, "3M"),
     (2_500_000, "2.5M")],
)  # fmt: skip
def test_short_number(value, text):
    assert short_number(value) == text


def test_last_days__fills_gaps_with_zeros_and_bounds_failed():
    today = date(2026, 12, 2)
    series = last_days({today: (5, 9), date(2026, 11, 30): (3, 1)}, today, days=4)
    assert series == [
        (date(2026, 11, 29), 0, 0),
        (date(2026, 11, 30), 3, 1),
        (date(2026, 12, 1), 0, 0),
        (today, 5, 5),  # failed can never exceed the total
    ]


def test_chart__bars_scale_to_a_nice_maximum():
    today = date(2026, 12, 2)
    series = last_days({today: (40, 10), today - timedelta(days=1): (20, 0)}, today)
    drawn = chart(series, width=600, height=140)
    assert drawn.scale == 50
    assert (drawn.total, drawn.failed) == (60, 10)
    assert len(drawn.bars) == 30
    last, before = drawn.bars[-1], drawn.bars[-2]
    plot_height = 140 - 6 - 18
    assert last.height == pytest.approx(plot_height * 40 / 50, abs=0.01)
    assert last.failed_height == pytest.approx(plot_height * 10 / 50, abs=0.01)
    assert last.y + last.height == pytest.approx(drawn.baseline)
    assert last.failed_y + last.failed_height == pytest.approx(drawn.baseline)
    assert before.height == pytest.approx(last.height / 2, abs=0.01)
    assert drawn.bars[0].height == 0
    # bars sit side by side inside the plot, left to right in date order
    xs = [bar.x for bar in drawn.bars]
    assert xs == sorted(xs)
    assert xs[0] >= drawn.left
    assert last.x + last.width <= 600
    assert [t.value for t in drawn.ticks] == [0, 25, 50]
    # today is labelled, and every 7th day before it
    assert [text for _, text in drawn.labels] == ["Nov 4", "Nov 11", "Nov 18", "Nov 25", "Dec 2"]


def test_chart__empty():
    drawn = chart(last_days({}, date(2026, 12, 2)))
    assert drawn.empty
    assert all(bar.height == 0 for bar in drawn.bars)
    assert [t.value for t in drawn.ticks] == [0, 1]
