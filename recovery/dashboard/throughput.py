"""Throughput over time: completed, failed and retried jobs per minute or per hour, as
the geometry of a server-rendered SVG (no chart library, no script). Pure.

The counts come from three grouped queries on indexed columns (``console.throughput``):
finished jobs by ``finished_at`` and retry events by their partial index — the chart's
cost follows the jobs finished in the window, not the 100,000 kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils.html import format_html_join
from django.utils.safestring import SafeString

from .chart import nice_ceiling, short_number

KINDS = ("completed", "failed", "retried")
RANGES = {  # ?range=: (slot length, number of slots, label)
    "hour": (timedelta(minutes=1), 60, "per minute, last hour"),
    "day": (timedelta(hours=1), 24, "per hour, last 24 hours"),
    "week": (timedelta(hours=1), 24 * 7, "per hour, last 7 days"),
}
WIDTH = 640
HEIGHT = 150
LEFT = 40
RIGHT = 20  # room for the newest slot's label, centred on it
TOP = 6
BOTTOM = 18


@dataclass(frozen=True)
class Segment:
    kind: str
    y: float
    height: float


@dataclass(frozen=True)
class Slot:
    start: datetime
    counts: dict[str, int]
    x: float
    width: float
    segments: tuple[Segment, ...]

    @property
    def title(self) -> str:
        parts = ", ".join(f"{self.counts[k]:,} {k}" for k in KINDS)
        return f"{self.start:%Y-%m-%d %H:%M} UTC: {parts}"


@dataclass(frozen=True)
class Throughput:
    slots: tuple[Slot, ...]
    ticks: tuple[tuple[float, str], ...]
    labels: tuple[tuple[float, str], ...]
    totals: dict[str, int]
    width: int
    height: int
    left: int
    baseline: float
    label: str

    @property
    def empty(self) -> bool:
        return not any(self.totals.values())

    @property
    def bars_svg(self) -> SafeString:
        """The bars as SVG markup, built here once (escaped by ``format_html``): a week of
        hours is 168 groups, which the template engine renders ten times slower."""
        return format_html_join(
            "",
            '<g class="slot"><title>{}</title>{}</g>',
            (
                (
                    slot.title,
                    format_html_join(
                        "",
                        '<rect class="tp-{}" x="{}" y="{}" width="{}" height="{}"/>',
                        ((s.kind, slot.x, s.y, slot.width, s.height) for s in slot.segments),
                    ),
                )
                for slot in self.slots
                if slot.segments
            ),
        )


def slot_start(moment: datetime, step: timedelta) -> datetime:
    """The start of the slot ``moment`` falls in (whole minutes or hours, UTC)."""
    if step >= timedelta(hours=1):
        return moment.replace(minute=0, second=0, microsecond=0)
    return moment.replace(second=0, microsecond=0)


def first_slot(now: datetime, range_name: str) -> datetime:
    step, count, _ = RANGES[range_name]
    return slot_start(now, step) - step * (count - 1)


def series(
    counts: Mapping[tuple[datetime, str], int], now: datetime, range_name: str
) -> list[tuple[datetime, dict[str, int]]]:
    """Each slot of the range ending now, oldest first, zeros filled in.

    ``counts`` maps (slot start, kind) to a number; slots outside the range are ignored.
    """
    step, count, _ = RANGES[range_name]
    start = first_slot(now, range_name)
    slots = [start + step * n for n in range(count)]
    return [(s, {k: max(int(counts.get((s, k), 0)), 0) for k in KINDS}) for s in slots]


def throughput(
    data: list[tuple[datetime, dict[str, int]]], range_name: str, *, width: int = WIDTH
) -> Throughput:
    """Stacked bars (completed at the foot, then failed, then retried), a nice scale."""
    _, _, label = RANGES[range_name]
    plot_width = width - LEFT - RIGHT
    plot_height = HEIGHT - TOP - BOTTOM
    baseline = float(HEIGHT - BOTTOM)
    peak = max((sum(c.values()) for _, c in data), default=0)
    scale = nice_ceiling(peak)
    pitch = plot_width / max(len(data), 1)
    gap = 1.0 if pitch > 3 else 0.0
    slots = []
    for index, (start, counts) in enumerate(data):
        y = baseline
        segments = []
        for kind in KINDS:
            height = plot_height * counts[kind] / scale
            if height > 0:
                y -= height
                segments.append(Segment(kind, round(y, 2), round(height, 2)))
        x = LEFT + index * pitch + gap / 2
        slots.append(
            Slot(start, counts, round(x, 2), round(max(pitch - gap, 0.5), 2), tuple(segments))
        )
    ticks = tuple(
        (round(baseline - plot_height * value / scale, 2), short_number(value))
        for value in sorted({0, scale // 2, scale})
    )
    every = max(len(slots) // 6, 1)  # about six time labels, the newest slot always one
    labels = tuple(
        (round(slot.x + slot.width / 2, 2), _label(slot.start, range_name))
        for index, slot in enumerate(slots)
        if (len(slots) - 1 - index) % every == 0
    )
    totals = {k: sum(c[k] for _, c in data) for k in KINDS}
    return Throughput(tuple(slots), ticks, labels, totals, width, HEIGHT, LEFT, baseline, label)


def _label(start: datetime, range_name: str) -> str:
    if range_name == "week":
        return f"{start:%b} {start.day} {start:%H}h"
    return f"{start:%H:%M}"
