"""The Summary page's "events per day" picture: geometry of a server-rendered SVG bar chart.

Pure: the view passes the per-day counts and today's date; the template only
draws the rectangles and labels computed here (no chart library, no CDN, no
script). Each day is one bar of all events with its failed share drawn over
its foot in another colour.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, timedelta

DAYS = 30
WIDTH = 600
HEIGHT = 140
LEFT = 44  # room for the scale's labels
RIGHT = 18  # room for the last date label's second half
BOTTOM = 18  # room for the date labels
TOP = 6
GAP = 2


@dataclass(frozen=True)
class Bar:
    day: date
    total: int
    failed: int
    x: float
    width: float
    y: float  # top of the whole bar
    height: float
    failed_y: float
    failed_height: float


@dataclass(frozen=True)
class Tick:
    value: int
    y: float
    label: str


@dataclass(frozen=True)
class Chart:
    bars: tuple[Bar, ...]
    ticks: tuple[Tick, ...]
    labels: tuple[tuple[float, str], ...]  # (x of the label's centre, text)
    width: int
    height: int
    top: int
    baseline: float
    left: int
    total: int
    failed: int
    scale: int

    @property
    def empty(self) -> bool:
        return self.total == 0


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, … that is at least ``value`` (≥ 1)."""
    if value <= 1:
        return 1
    magnitude = 1
    while True:
        for step in (1, 2, 5):
            if step * magnitude >= value:
                return step * magnitude
        magnitude *= 10


def short_number(value: int) -> str:
    """Axis labels: ``950``, ``1.5k``, ``20k``, ``3M``."""
    if value < 1000:
        return str(value)
    if value < 1_000_000:
        text = f"{value / 1000:.1f}".rstrip("0").rstrip(".")
        return f"{text}k"
    text = f"{value / 1_000_000:.1f}".rstrip("0").rstrip(".")
    return f"{text}M"


def last_days(
    counts: Mapping[date, tuple[int, int]], today: date, days: int = DAYS
) -> list[tuple[date, int, int]]:
    """(day, total, failed) for each of the ``days`` days ending ``today``, zeros filled in."""
    first = today - timedelta(days=days - 1)
    series = []
    for index in range(days):
        day = first + timedelta(days=index)
        total, failed = counts.get(day, (0, 0))
        series.append((day, max(total, 0), max(min(failed, total), 0)))
    return series


def chart(
    series: list[tuple[date, int, int]],
    *,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> Chart:
    """Bars scaled to a "nice" maximum, three scale ticks, a date label every week."""
    plot_width = width - LEFT - RIGHT
    plot_height = height - TOP - BOTTOM
    baseline = float(height - BOTTOM)
    peak = max((total for _, total, _ in series), default=0)
    scale = nice_ceiling(peak)
    slot = plot_width / max(len(series), 1)
    bar_width = max(slot - GAP, 1.0)
    bars = []
    for index, (day, total, failed) in enumerate(series):
        bar_height = plot_height * total / scale
        failed_height = plot_height * failed / scale
        x = LEFT + index * slot + GAP / 2
        bars.append(
            Bar(
                day=day,
                total=total,
                failed=failed,
                x=round(x, 2),
                width=round(bar_width, 2),
                y=round(baseline - bar_height, 2),
                height=round(bar_height, 2),
                failed_y=round(baseline - failed_height, 2),
                failed_height=round(failed_height, 2),
            )
        )
    ticks = tuple(
        Tick(value, round(baseline - plot_height * value / scale, 2), short_number(value))
        for value in sorted({0, scale // 2, scale})
    )
    # Label every 7th day counted back from today, so today is always labelled.
    labels = tuple(
        (round(bar.x + bar.width / 2, 2), f"{bar.day:%b} {bar.day.day}")
        for index, bar in enumerate(bars)
        if (len(bars) - 1 - index) % 7 == 0
    )
    return Chart(
        bars=tuple(bars),
        ticks=ticks,
        labels=labels,
        width=width,
        height=height,
        top=TOP,
        baseline=baseline,
        left=LEFT,
        total=sum(total for _, total, _ in series),
        failed=sum(failed for _, _, failed in series),
        scale=scale,
    )
