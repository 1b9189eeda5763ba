"""The engine's SQL, one module per vendor, behind one interface (``base.Statements``).

``statements()`` gives the vendor's class for a connection, made once per
vendor; callers run its named statements and never branch on the vendor
themselves. ``postgresql`` and ``sqlite`` hold each vendor's statements by
name, with what each does and why it is worded so.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from .base import BUSY, Cursor, Row, Statements
from .postgresql import PostgreSQL
from .sqlite import SQLite

__all__ = ["BUSY", "Cursor", "Row", "Statements", "statements"]

VENDORS: dict[str, type[Statements]] = {"postgresql": PostgreSQL, "sqlite": SQLite}
_made: dict[str, Statements] = {}


def statements(conn: BaseDatabaseWrapper | None = None) -> Statements:
    """The statements of ``conn``'s vendor (default: the default database's)."""
    vendor = (conn if conn is not None else connections[DEFAULT_DB_ALIAS]).vendor
    found = _made.get(vendor)
    if found is None:
        if vendor not in VENDORS:
            raise NotImplementedError(f"durable runs on PostgreSQL or SQLite, not {vendor}")
        found = _made[vendor] = VENDORS[vendor]()
    return found
