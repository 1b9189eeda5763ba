"""The clock lease times are written with, and whether a caller's transaction is open.

Read by the models' query methods and by every module that writes leases, so
all of them compare times on one clock.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone


def db_now() -> Any:
    """``now`` for ORM filters, on the clock that lease times are written with.

    PostgreSQL's own clock (workers on several machines agree on it; a web
    server's skew does not matter), else this process's (SQLite: one machine).
    """
    return Now() if connection.vendor == "postgresql" else timezone.now()


def database_now() -> datetime:
    """``now`` as a value, on the clock lease times are written with (see ``db_now``)."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def in_callers_transaction(conn: Any = None) -> bool:
    """Whether ``conn`` (default: the default connection) is inside a transaction its
    caller opened.

    The atomic blocks a Django ``TestCase`` wraps around each test (marked
    ``_from_testcase``, the mark ``atomic(durable=True)`` looks for) stand for
    "no transaction": they are rolled back only to isolate tests, so tests see
    what production does outside a transaction.
    """
    conn = conn if conn is not None else connection
    return conn.in_atomic_block and any(
        not getattr(block, "_from_testcase", False) for block in conn.atomic_blocks
    )
