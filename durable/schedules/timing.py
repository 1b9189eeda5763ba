"""When a schedule's occurrences fall: pure functions, no ORM, no clock reads (pass ``now`` in).

A rule is either a 5-field cron expression, evaluated on the wall clock of a
time zone (the schedule's own, else ``settings.TIME_ZONE``), or a fixed
interval, which is plain elapsed time and knows no time zone.

Cron matching is ``cronsim``'s, which follows Debian's cron, DST quirks
included:

- *Spring forward*: an occurrence whose wall-clock time does not exist that
  day (``30 2 * * *`` when 02:00 jumps to 03:00) runs at the first minute
  after the jump, once.
- *Fall back*: an occurrence whose wall-clock time happens twice
  (``30 1 * * *`` when 02:00 falls back to 01:00 in some zones) runs once, at
  the first of the two. Rules that match every hour (``0 * * * *``) run in
  both copies of the repeated hour, as Debian's cron does.

Every instant handed out is an aware UTC ``datetime``; it is the occurrence's
identity together with the schedule id, so it must come out the same in every
process that computes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

# An occurrence later than this is "missed" for the skip policy (the workers
# were down, or none ran for a while); a tick a few heartbeats late is not.
ON_TIME_GRACE = timedelta(minutes=5)
# Missed occurrences are counted one by one up to this many; beyond it the
# count says "at least". Keeps a year-long outage of a per-minute rule cheap.
MAX_COUNTED = 1000
MIN_INTERVAL = timedelta(seconds=0.1)
MAX_INTERVAL = timedelta(days=366)
MAX_CRON_CHARS = 200

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


class CatchUp(StrEnum):
    """What a schedule does with occurrences missed while no worker ticked.

    ``latest``: run once, for the latest missed occurrence (never N times).
    ``skip``: run nothing for occurrences later than ``ON_TIME_GRACE``; wait for the next one.
    """

    LATEST = "latest"
    SKIP = "skip"


# --- validation -------------------------------------------------------------------------


def normalise_cron(expression: str) -> str:
    """The expression as stored: whitespace collapsed, macros expanded; ValueError if invalid."""
    if not isinstance(expression, str):
        raise ValueError("a cron expression is text, e.g. '30 3 * * *'")
    text = " ".join(expression.split())
    text = MACROS.get(text.lower(), text)
    if not text:
        raise ValueError("the cron expression is empty")
    if len(text) > MAX_CRON_CHARS:
        raise ValueError(f"the cron expression is longer than {MAX_CRON_CHARS} characters")
    if len(text.split(" ")) != 5:
        raise ValueError(
            f"{text!r} has {len(text.split(' '))} fields; use 5: minute hour day-of-month "
            "month day-of-week (e.g. '30 3 * * *'), or @hourly/@daily/@weekly/@monthly/@yearly"
        )
    try:
        probe = CronSim(text, datetime(2000, 1, 1, tzinfo=UTC))
        next(probe)
    except CronSimError as exc:
        raise ValueError(f"{text!r} is not a valid cron expression: {exc}") from None
    except StopIteration:
        raise ValueError(f"{text!r} never matches") from None
    return text


def time_zone(name: str) -> ZoneInfo:
    """A zoneinfo time zone by IANA name; ValueError names the problem."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("a time zone name is required, e.g. 'Europe/Helsinki' or 'UTC'")
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{name!r} is not a known time zone (use an IANA name)") from None


def check_interval(every: timedelta) -> timedelta:
    if not isinstance(every, timedelta) or not MIN_INTERVAL <= every <= MAX_INTERVAL:
        raise ValueError("the interval must be between 0.1 seconds and 366 days")
    return every


# --- the rule -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A cron expression in a time zone, or an interval (exactly one of them)."""

    cron: str = ""
    every: timedelta | None = None
    zone: str = "UTC"

    def __post_init__(self) -> None:
        if bool(self.cron) == (self.every is not None):
            raise ValueError("a rule has either a cron expression or an interval")

    def _local(self, moment: datetime) -> datetime:
        return moment.astimezone(ZoneInfo(self.zone))

    def next_after(self, moment: datetime) -> datetime:
        """The first occurrence strictly after ``moment`` (cron), or ``moment + every``."""
        if self.every is not None:
            return moment + self.every
        try:
            found = next(CronSim(self.cron, self._local(moment)))
        except StopIteration:  # no match within 50 years: effectively never
            return datetime.max.replace(tzinfo=UTC)
        return found.astimezone(UTC)

    def latest_before(self, moment: datetime) -> datetime | None:
        """A cron occurrence at or before ``moment``, found by iterating backwards."""
        try:
            start = self._local(moment + timedelta(microseconds=1))
            found = next(CronSim(self.cron, start, reverse=True))
        except StopIteration:
            return None
        return found.astimezone(UTC)


@dataclass(frozen=True)
class Plan:
    """What one tick does for a due schedule.

    ``latest`` is the latest due occurrence; ``run`` says whether to apply it
    (False: the skip policy passes over it too). ``missed`` counts the
    earlier due occurrences passed over (``missed_capped``: at least that
    many); ``next_run_at`` is the first occurrence after ``now``.
    """

    latest: datetime
    run: bool
    missed: int
    missed_capped: bool
    next_run_at: datetime


def plan(
    rule: Rule,
    due_at: datetime,
    now: datetime,
    catch_up: CatchUp | str = CatchUp.LATEST,
    grace: timedelta = ON_TIME_GRACE,
) -> Plan:
    """Given the stored next occurrence ``due_at`` (at or before ``now``), decide this tick.

    The occurrences from ``due_at`` to ``now`` are all due; only the latest
    of them is ever applied, so a schedule that was not ticked for a week
    runs once when a worker comes back, not once per missed occurrence.
    """
    if due_at > now:
        raise ValueError("plan() is for a due schedule: due_at is after now")
    if rule.every is not None:
        count = (now - due_at) // rule.every
        latest = due_at + count * rule.every
        missed, capped = count, False
    else:
        latest, missed, capped = _latest_cron(rule, due_at, now)
    following = rule.next_after(latest)
    while following <= now:  # defensive: backwards search and forward steps disagreed
        latest, following = following, rule.next_after(following)
        missed += 1
    run = CatchUp(catch_up) is CatchUp.LATEST or now - latest <= grace
    return Plan(latest, run, missed, capped, following)


def _latest_cron(rule: Rule, due_at: datetime, now: datetime) -> tuple[datetime, int, bool]:
    latest, missed = due_at, 0
    while missed < MAX_COUNTED:
        following = rule.next_after(latest)
        if following > now:
            return latest, missed, False
        latest, missed = following, missed + 1
    # Too many to count: jump to the end, then step forward to be exact.
    jumped = rule.latest_before(now)
    if jumped is not None and jumped > latest:
        latest = jumped
    return latest, missed, True


def occurrence_key(schedule_id: int, scheduled_for: datetime) -> str:
    """The deterministic id of one occurrence: the schedule and the UTC instant."""
    moment = scheduled_for.astimezone(UTC)
    return f"schedule:{schedule_id}@{moment.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}"


def describe(rule: Rule) -> str:
    """For lists: ``cron 30 3 * * * (Europe/Helsinki)`` or ``every 1h``."""
    if rule.every is None:
        return f"cron {rule.cron} ({rule.zone})"
    return f"every {format_interval(rule.every)}"


def format_interval(every: timedelta) -> str:
    seconds = every.total_seconds()
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def parse_interval(text: str) -> timedelta:
    """``90s``, ``15m``, ``1h``, ``1d``, ``2w``, or seconds (``0.5``); ValueError otherwise."""
    raw = (text or "").strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    number, unit = (raw[:-1], raw[-1]) if raw[-1:] in units else (raw, "s")
    try:
        amount = float(number)
    except ValueError:
        raise ValueError(
            f"{text!r} is not an interval: use a number with s, m, h, d or w (e.g. 15m)"
        ) from None
    if amount != amount or amount in (float("inf"), float("-inf")):  # NaN, infinities
        raise ValueError(f"{text!r} is not an interval")
    return check_interval(timedelta(seconds=amount * units[unit]))
