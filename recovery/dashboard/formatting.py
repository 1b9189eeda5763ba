"""How the dashboard words numbers, times and tallies: pure functions, ``now`` passed in."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

MINUTE = 60
HOUR = 60 * MINUTE
DAY = 24 * HOUR
RELATIVE_DAYS = 30  # older or further ahead than this: the date itself


def number(value: int | None) -> str:
    """``9412`` → ``"9,412"``; None → ``"—"``."""
    return "—" if value is None else f"{value:,}"


def relative_time(moment: datetime | None, now: datetime) -> str:
    """``"in 5 s"``, ``"3 min ago"``, ``"2 h ago"``, ``"4 d ago"``, or the date when far.

    Rounded down to the unit shown, so a retry due in 119 s reads "in 1 min"
    rather than promising "in 2 min". Under a second either way is "now".
    """
    if moment is None:
        return "—"
    seconds = (moment - now).total_seconds()
    ahead = seconds > 0
    span = abs(seconds)
    if span < 1:
        return "now"
    if span < MINUTE:
        text = f"{int(span)} s"
    elif span < HOUR:
        text = f"{int(span // MINUTE)} min"
    elif span < DAY:
        text = f"{int(span // HOUR)} h"
    elif span < RELATIVE_DAYS * DAY:
        text = f"{int(span // DAY)} d"
    else:
        return moment.date().isoformat()
    return f"in {text}" if ahead else f"{text} ago"


def _top(counts: Mapping[str, int], limit: int) -> list[tuple[str, int]]:
    """The ``limit`` largest counts, ties by name so the order is stable."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: max(limit, 0)]


def actor_tally(
    users: Mapping[str, int] | None,
    users_overflow: int,
    addresses: Mapping[str, int] | None,
    addresses_overflow: int,
    *,
    shown: int = 1,
) -> str:
    """``"alice 25, 203.0.113.9 30, and 9,412 others"``: who a Security row is about.

    The ``shown`` busiest users, then the ``shown`` busiest addresses (one of
    each by default, as in the example). "Others" counts the *refusals* not
    attributed to a name shown — beyond the tally's cap (the overflow) or just
    not among the busiest. A refusal usually names both a user and an address,
    so the two remainders overlap; the larger one is reported, never their sum.
    """
    users, addresses = dict(users or {}), dict(addresses or {})
    top_users, top_addresses = _top(users, shown), _top(addresses, shown)
    parts = [f"{name} {count:,}" for name, count in (*top_users, *top_addresses)]
    rest_users = sum(users.values()) - sum(c for _, c in top_users) + max(users_overflow, 0)
    rest_addresses = (
        sum(addresses.values()) - sum(c for _, c in top_addresses) + max(addresses_overflow, 0)
    )
    others = max(rest_users, rest_addresses, 0)
    if not parts:
        return f"{others:,} others" if others else "—"
    if others:
        parts.append(f"and {others:,} others")
    return ", ".join(parts)


def excerpt(text: str | None, limit: int) -> str:
    """``text`` on one line, cut at ``limit`` characters with "…"."""
    flat = " ".join((text or "").split())
    if len(flat) <= limit:
        return flat
    return flat[: max(limit - 1, 0)] + "…"


def percent(done: int, total: int | None) -> int | None:
    """Whole percent of ``done`` of ``total`` (None when the total is unknown), at most 100."""
    if not total or total <= 0:
        return None
    return max(0, min(100, int(done * 100 // total)))
