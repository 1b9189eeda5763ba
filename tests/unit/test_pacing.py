"""durable.pacing: the size of the next unit, from the rate the last one ran at."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from durable import checks
from durable.pacing import MAX_GROWTH, Measure, Pacer, first_size, next_size

TARGET = 0.5


@pytest.mark.parametrize(
    ("last", "cap", "floor", "first", "expected"),
    [
        # No measurement (the first unit after a claim): a thirty-second of the cap.
        (None, 10_000, 1, None, 313),
        (None, 10, 1, None, 1),  # at least one item
        (None, 10_000, 500, None, 500),  # never below the floor
        (None, 10_000, 1, 50, 50),  # the operation's own first size
        (None, 10_000, 1, 50_000, 10_000),  # …within the cap
        # 1,000 items in 0.1 s: 5,000 would take the target, but a unit at most doubles.
        (Measure(1000, 0.1), 10_000, 1, None, 2000),
        # 1,000 items in 0.4 s: 1,250 take 0.5 s.
        (Measure(1000, 0.4), 10_000, 1, None, 1250),
        # 1,000 items in 2 s (a slow database, a loaded machine): shrink at once to 250.
        (Measure(1000, 2.0), 10_000, 1, None, 250),
        # Very slow: never below the floor, never below one item.
        (Measure(10, 100.0), 10_000, 1, None, 1),
        (Measure(10, 100.0), 10_000, 5, None, 5),
        # Fast: the cap (the operation's line/row/byte limit) is the upper bound.
        (Measure(8000, 0.1), 10_000, 1, None, 10_000),
        # A clock that did not move (a coarse clock, an instant unit): grow, by the limit.
        (Measure(100, 0.0), 10_000, 1, None, 200),
        # Cut short by the end of the data and quick: keep the pace it was given.
        (Measure(3, 0.01, asked=4000), 10_000, 1, None, 4000),
        # …but short and slow is a real measurement: shrink.
        (Measure(300, 1.0, asked=4000), 10_000, 1, None, 150),
        # A floor above the cap (a tiny cap): the cap wins.
        (Measure(5, 0.01), 3, 10, None, 3),
    ],
)
def test_next_size__aims_at_the_target_within_the_caps(last, cap, floor, first, expected):
    assert next_size(last, target=TARGET, cap=cap, floor=floor, first=first) == expected


def test_next_size__converges_on_the_target_for_a_steady_rate():
    rate = 20_000.0  # items per second, plus a fixed cost of 5 ms per unit
    sizes, last = [], None
    for _ in range(12):
        size = next_size(last, target=TARGET, cap=1_000_000)
        sizes.append(size)
        last = Measure(size, size / rate + 0.005)
    assert sizes[0] == first_size(1_000_000)
    # Grows by at most MAX_GROWTH per unit, then settles just under rate * target.
    assert all(b <= a * MAX_GROWTH for a, b in itertools.pairwise(sizes))
    assert 0.9 * rate * TARGET <= sizes[-1] <= rate * TARGET


@pytest.mark.parametrize(("cap", "floor"), [(0, 1), (10, 0)])
def test_next_size__refuses_caps_that_allow_no_item(cap, floor):
    with pytest.raises(ValueError, match="at least one item"):
        next_size(None, target=TARGET, cap=cap, floor=floor)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_pacer__times_each_unit_from_its_size_to_done():
    clock = Clock()
    pacer = Pacer(cap=10_000, target=TARGET, clock=clock)
    assert pacer.size() == 313  # the first unit after a claim is small
    clock.now += 0.05  # read, run and committed in 50 ms
    pacer.done()
    assert pacer.last == Measure(313, pytest.approx(0.05), asked=313)
    assert pacer.size() == 626  # could take 3,130: at most doubled
    clock.now += 0.6
    pacer.done(500)  # the data held only 500 more, and they took longer than the target
    assert pacer.size() == 416


def test_pacer__a_size_never_followed_by_done_is_not_measured():
    clock = Clock()
    pacer = Pacer(cap=1000, target=TARGET, clock=clock)
    pacer.size()
    clock.now += 30.0  # nothing was cut: the generator ended, or went on to other work
    assert pacer.size() == first_size(1000)
    pacer.done()
    pacer.done()  # twice: the second has nothing to measure
    assert pacer.last is not None
    assert pacer.last.size == first_size(1000)


def test_pacer__reads_the_target_from_the_settings(settings):
    settings.DURABLE_UNIT_TARGET_SECONDS = 2.0
    assert Pacer(cap=10).target == 2.0


@pytest.mark.parametrize(
    ("remaining", "expected"),
    [(0, 0), (1, 1), (313, 1), (314, 2), (10_000, 32)],
)
def test_pacer__estimates_the_units_left_at_the_current_pace(remaining, expected):
    pacer = Pacer(cap=10_000, target=TARGET, clock=Clock())
    assert pacer.units_for(remaining) == expected


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (0.4, True),
        (0.05, True),  # the bounds are allowed
        (60, True),
        (0.01, False),  # a unit so short its commit costs more than its work
        (600, False),  # longer than a lease's worth of progress lost to a crash
        ("0.4", False),  # a string from the environment, not converted
        (True, False),
    ],
)
def test_check__the_unit_target_must_be_a_sensible_number(value, ok):
    site = SimpleNamespace(DURABLE_BACKUP_DIR="/b", DURABLE_UNIT_TARGET_SECONDS=value)
    ids = [m.id for m in checks.settings_problems(site, tasks_framework=True)]
    assert ids == ([] if ok else ["durable.E003"])
