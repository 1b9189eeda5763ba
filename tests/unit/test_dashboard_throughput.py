from datetime import UTC, datetime, timedelta

from recovery.dashboard import throughput as t

NOW = datetime(2026, 12, 3, 10, 30, 45, tzinfo=UTC)


def test_series__fills_every_slot_of_the_range_with_zeros_and_ignores_others():
    start = t.first_slot(NOW, "hour")
    assert start == datetime(2026, 12, 3, 9, 31, tzinfo=UTC)
    counts = {(start, "completed"): 3, (datetime(2026, 12, 3, 10, 30, tzinfo=UTC), "failed"): 2,
              (start - timedelta(minutes=1), "completed"): 99}  # fmt: skip
    data = t.series(counts, NOW, "hour")
    assert len(data) == 60
    assert data[0] == (start, {"completed": 3, "failed": 0, "retried": 0})
    assert data[-1][1] == {"completed": 0, "failed": 2, "retried": 0}
    assert sum(sum(c.values()) for _, c in data) == 5


def test_series__hours():
    data = t.series({}, NOW, "week")
    assert len(data) == 168
    assert data[-1][0] == datetime(2026, 12, 3, 10, tzinfo=UTC)


def test_throughput__stacks_kinds_on_a_nice_scale():
    data = t.series({}, NOW, "hour")
    data[-1] = (data[-1][0], {"completed": 6, "failed": 2, "retried": 1})
    chart = t.throughput(data, "hour")
    last = chart.slots[-1]
    assert [s.kind for s in last.segments] == ["completed", "failed", "retried"]
    heights = [s.height for s in last.segments]
    assert heights[0] == 3 * heights[1]  # 6 vs 2 on one scale (10)
    assert last.segments[0].y + last.segments[0].height == chart.baseline
    assert chart.totals == {"completed": 6, "failed": 2, "retried": 1}
    assert [label for _, label in chart.ticks] == ["0", "5", "10"]
    assert chart.labels[-1][1] == "10:30"
    assert not chart.empty
    assert t.throughput(t.series({}, NOW, "day"), "day").empty


def test_settled_until__an_hour_is_counted_for_good_only_after_it_settled():
    from recovery.dashboard.rollup import SETTLE, settled_until

    ten = datetime(2026, 12, 3, 10, tzinfo=UTC)
    assert settled_until(ten + SETTLE - timedelta(seconds=1)) == ten - timedelta(hours=1)
    assert settled_until(ten + SETTLE) == ten  # 9h closed SETTLE ago: counted from now on
    assert settled_until(NOW) == ten


def test_hours_between__whole_hours_from_the_first_full_one():
    from recovery.dashboard.rollup import hours_between

    ten = datetime(2026, 12, 3, 10, tzinfo=UTC)
    assert hours_between(ten, ten) == []
    assert hours_between(ten, ten + timedelta(hours=2)) == [ten, ten + timedelta(hours=1)]
    assert hours_between(ten + timedelta(minutes=1), ten + timedelta(hours=2)) == [
        ten + timedelta(hours=1)
    ]
