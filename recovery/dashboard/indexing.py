"""``recovery.search_index``: bring SQLite's search index and day counts up to date.

SQLite defers them (``recovery.dashboard.sql``): the ingest writes each line
once, and this operation indexes and counts the new events in bulk, a batch
per unit, moving the cursor in the same transaction. It is enqueued (one at a
time, by ``unique_key``) when an ingest or import finishes and on worker
heartbeats while events wait. On PostgreSQL there is never anything to do.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from django.db import connection

from durable import signals
from durable.errors import DurableError
from durable.jobs import enqueue
from durable.models import Job
from durable.operations import Access, JobContext, Operation, Unit, register

from . import sql

log = logging.getLogger("recovery.dashboard")

OPERATION = "recovery.search_index"
UNIQUE_KEY = "recovery-search-index"
# Finishing one of these leaves new events behind.
PRODUCERS = frozenset({"recovery.ingest", "import.jsonl", "import.csv"})
# Readers scan the tail beyond the index directly, which costs nothing for a
# few thousand rows: the catch-up is worth a job only once this many wait.
WORTH_A_JOB = 2_000


@register
class SearchIndex(Operation):
    name = OPERATION
    label = "Catch up the Recovery search index"
    description = "Indexes and counts new Recovery events in bulk (SQLite)."
    access = Access.SYSTEM  # enqueued by the site itself, never from New job or the API
    atomic_units = True  # index rows, counts and cursor commit with the checkpoint
    max_attempts = 10

    def total_units(self, ctx: JobContext) -> int:
        return -(-sql.pending(connection) // sql.CATCH_UP_BATCH)

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        while (upto := sql.indexed_upto(connection)) is not None and sql.has_pending(connection):
            # Keyed by where the batch starts: a replay after a crash (the cursor
            # did not move) is the same unit; the next batch is a new one.
            yield Unit(key=f"after:{upto}", payload={"after": upto}, checkpoint={"after": upto})

    def run_unit(self, ctx: JobContext, unit: Unit) -> dict[str, Any]:
        return {"indexed": sql.catch_up(connection)}


def request_catch_up(owner: str = "recovery", *, at_least: int | None = None) -> Job | None:
    """Enqueue the indexer if ``at_least`` (default WORTH_A_JOB) events wait (never twice)."""
    if not sql.has_pending(connection, WORTH_A_JOB if at_least is None else at_least):
        return None
    try:
        return enqueue(OPERATION, {}, owner=owner[:150], unique_key=UNIQUE_KEY)
    except DurableError:
        log.exception("could not enqueue the search index catch-up")
        return None


def on_worker_beat(sender: Any, *, worker_id: str = "", **kwargs: Any) -> None:
    request_catch_up(owner=f"worker {worker_id}")


def on_job_state_changed(
    sender: Any, *, operation: str = "", new_state: str = "", **kwargs: Any
) -> None:
    if new_state == "completed" and operation in PRODUCERS:
        request_catch_up(owner=operation)


def connect() -> None:
    if not sql.deferred(connection):
        return
    signals.worker_started.connect(on_worker_beat, dispatch_uid="recovery.index.started")
    signals.worker_heartbeat.connect(on_worker_beat, dispatch_uid="recovery.index.beat")
    signals.job_state_changed.connect(on_job_state_changed, dispatch_uid="recovery.index.jobs")
