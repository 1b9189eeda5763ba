"""Helpers in the test's own thread and connection: run jobs there, lose its database."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.db import connections

from durable.lease import claim
from durable.models import Job
from durable.operations import registered
from durable.worker import Worker


def drain(
    job_id: int | None = None, *, owner: str = "test-worker", timeout: float = 10.0
) -> Job | None:
    """Claim and run due jobs until ``job_id`` settles (finished or paused) or nothing is due."""
    worker = Worker(worker_id=owner, burst=True, lease_seconds=30)
    ops = sorted(registered())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        claimed = claim(owner, queues=["default"], operations=ops, lease_seconds=30, job_id=job_id)
        if claimed is not None:
            worker.execute(*claimed)
            continue
        if job_id is None:
            return None
        job = Job.objects.get(pk=job_id)
        if job.is_finished or job.state == "paused":
            return job
        time.sleep(0.01)  # waiting out a short backoff
    raise AssertionError(f"job {job_id} did not settle within {timeout}s")


@contextmanager
def unreachable_database(alias: str = "default") -> Iterator[None]:
    """This thread's connection to ``alias`` points where no database answers, then back.

    A real failure to connect, not a mock: PostgreSQL at a loopback port nothing
    listens on (refused at once), SQLite at a file in a directory that does not
    exist (SQLITE_CANTOPEN). Needs ``django_db(transaction=True)``: the test's
    own transaction would be lost with the connection.
    """
    conn = connections[alias]
    saved = dict(conn.settings_dict)
    conn.close()
    if conn.vendor == "sqlite":
        conn.settings_dict["NAME"] = str(Path(saved["NAME"]).parent / "gone" / "db.sqlite3")
    else:
        with socket.socket() as probe:  # a free port, closed again: connecting is refused
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        conn.settings_dict.update(HOST="127.0.0.1", PORT=port)
    try:
        yield
    finally:
        conn.close()
        conn.settings_dict.clear()
        conn.settings_dict.update(saved)
