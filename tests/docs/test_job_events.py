"""docs/reference/job-states.md lists every kind of job event the code writes.

Event kinds are plain strings written in a few places; this reads those places in
the source: the event tuples of the engine (``("failed", reason, {...})``), the
``kind="…"`` and ``kind, message = "…"`` assignments, the operator-action table,
the kinds of event rows inserted by SQL (``'started', ''``), the events
``durable.endings`` decides (``Event("completed", …)``), and ``ctx.event("…")``
in any operation.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "job-states.md"
WORKER = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "durable" / "worker").glob("*.py"))
SQL = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "durable" / "sql").glob("*.py"))
ENGINE = (
    "durable/jobs.py",
    "durable/lease.py",
    "durable/transitions.py",
    "durable/endings.py",
    "durable/rescue.py",
    *WORKER,
    *SQL,
)
PATTERNS = (
    # ("kind", message, {data}) handed to add_events / _save: the third item (a dict or
    # a name) tells it from any tuple of strings, such as a list of field names.
    re.compile(
        r"(?<![\w.])\(\s*\"([a-z_]+)\",\s*(?:reason|message|why|note|entry\[\"message\"\]"
        r"|\"[^\"]*\"|f\"[^\"]*\"),\s*(?:\{|[a-z_]+\))"
    ),
    re.compile(r"\bkind=\"([a-z_]+)\""),
    re.compile(r"\bEvent\(\s*\"([a-z_]+)\""),  # durable.endings' decided events
    re.compile(r"\bkind, message = \"([a-z_]+)\""),
    re.compile(r"\): \"([a-z_]+)\",\s*$", re.MULTILINE),  # _EVENT_KIND's values
    # An event row inserted by SQL (the claim's "started", enqueue_many's "enqueued"):
    # job, seq, 'kind', '' (the message) — a string literal in the statement.
    re.compile(r"(?:event_seq|id|value|%s), (?:1|%s), '([a-z_]+)', ''"),
)
CTX_EVENT = re.compile(r"ctx\.event\(\s*\"([a-z_]+)\"")
NOT_KINDS = {"lease_released"}  # log_state() lines, not events


def written_kinds() -> set[str]:
    kinds: set[str] = set()
    for name in ENGINE:
        text = (ROOT / name).read_text(encoding="utf-8")
        for pattern in PATTERNS:
            kinds.update(pattern.findall(text))
    for path in [*ROOT.glob("durable/**/*.py"), *ROOT.glob("recovery/**/*.py")]:
        kinds.update(CTX_EVENT.findall(path.read_text(encoding="utf-8")))
    return kinds - NOT_KINDS


def documented_kinds() -> set[str]:
    section = PAGE.read_text(encoding="utf-8").split("## Job events", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {kind for row in rows for kind in re.findall(r"`([a-z_]+)`", row.split(" | ")[0])}


def test_every_event_kind_the_code_writes_is_documented() -> None:
    kinds = written_kinds()
    # The scan must see the engine's kinds at all, or the check below proves nothing.
    assert {"enqueued", "started", "completed", "reclaimed", "rescheduled", "moved"} <= kinds
    assert kinds - documented_kinds() == set()


def test_the_page_lists_no_kind_the_code_never_writes() -> None:
    # "paused" by a turned-away target is target.value; "paused"/"failed" are written directly too.
    assert documented_kinds() - written_kinds() == set()
