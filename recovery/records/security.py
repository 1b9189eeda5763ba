"""Counting one more security refusal of a kind: one atomic upsert per refusal.

One summary row per kind (stream, category, key, source, severity, CWE), never
per actor, so an attack from a million addresses updates one row. Never raises;
inside the caller's transaction the count is taken where a rollback cannot undo
it (``record_security`` says how, per database).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from durable.models import in_callers_transaction
from durable.policy import truncate_utf8

from ..models import SecurityEvent
from ..parsing import clean_detail, clean_text, normalise_severity, split_addresses
from ..policy import MAX_ACTOR_CHARS, MAX_ACTORS, normalise_cwe

log = logging.getLogger("recovery.records")

MAX_SECURITY_DETAIL_BYTES = 1024

# How long a caller inside a transaction waits for its refusal to be counted on
# a connection of its own (PostgreSQL) before it goes on without the answer.
SEPARATE_RECORD_TIMEOUT = 10.0
# ...and how long that connection waits for a row lock someone else holds.
SEPARATE_LOCK_TIMEOUT = "5s"


def security_identity(
    *, category: str, key: str, source: str, severity: str, cwe: Any, stream: str
) -> dict[str, str]:
    return {
        "stream": clean_text(stream, 40) or "security",
        "category": clean_text(category, 64) or "unknown",
        "key": clean_text(key, 128) or "unknown",
        "source": clean_text(source, 64),
        "severity": normalise_severity(severity),
        "cwe": clean_text(normalise_cwe(cwe), 16),
    }


def record_security(
    *,
    category: str,
    key: str,
    detail: str = "",
    severity: str = "warning",
    cwe: str | int = "",
    source: str = "",
    user_id: str | int = "",
    username: str = "",
    ip: str | None = None,
    stream: str = "security",
) -> SecurityEvent | None:
    """Count one more of this kind of refusal, in one atomic upsert. Never raises.

    A refusal is usually followed by the caller giving up — often by rolling
    back. So inside the caller's transaction it is not written on the caller's
    connection (where a rollback would undo it, and the row lock would be held
    until the caller's transaction ends, stalling every other recorder):

    - on PostgreSQL it is recorded at once on a connection of its own (a
      short-lived thread), committed whatever the caller does next;
    - on SQLite that second connection would wait for the caller's own write
      lock, so it is recorded right after the caller commits
      (``on_commit``); if the caller rolls back, it is lost (docs:
      explanation/recovery-and-security-events.md, "What the engine reports").
      Returns None then: the row is not written yet.
    """
    try:
        values = _security_values(
            identity=security_identity(
                category=category,
                key=key,
                source=source,
                severity=severity,
                cwe=cwe,
                stream=stream,
            ),
            detail=detail,
            user_id=user_id,
            username=username,
            ip=ip,
        )
        if not in_callers_transaction():
            return _count_security(values)
        if connection.vendor == "sqlite":
            transaction.on_commit(lambda: _count_security_logged(values), robust=True)
            return None
        return _count_security_separately(values)
    except Exception:
        log.exception("could not record a security event", extra={"category": str(category)[:64]})
        return None


def _security_values(
    *, identity: dict[str, str], detail: str, user_id: Any, username: str, ip: str | None
) -> dict[str, Any]:
    ipv4, ipv6, _ = split_addresses(ip)
    if isinstance(user_id, int) and not isinstance(user_id, bool):
        user_id = str(user_id)
    user = clean_text(username, 150) or (
        f"#{clean_text(user_id, 64)}" if clean_text(user_id, 64) else ""
    )
    return {
        "identity": identity,
        "detail": truncate_utf8(clean_detail(detail), MAX_SECURITY_DETAIL_BYTES),
        "user": user[:MAX_ACTOR_CHARS],
        "address": (ipv4 or ipv6 or "")[:MAX_ACTOR_CHARS],
        "ipv4": ipv4,
        "ipv6": ipv6,
        "now": timezone.now(),
    }


def _count_security_logged(values: dict[str, Any]) -> SecurityEvent | None:
    try:
        return _count_security(values)
    except Exception:
        category = values["identity"]["category"]
        log.exception("could not record a security event", extra={"category": category})
        return None


def _count_security_separately(values: dict[str, Any]) -> SecurityEvent | None:
    """``_count_security`` on a connection of its own, committed on its own (PostgreSQL)."""
    outcome: list[SecurityEvent | None] = []

    def run() -> None:
        try:
            # This thread's connection, not the caller's. The lock timeout is the
            # transaction's own (set_config(..., true)), not the session's: behind a
            # pooler in transaction mode a session setting would stay on a server
            # connection that other clients get next.
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT set_config('lock_timeout', %s, true)", [SEPARATE_LOCK_TIMEOUT]
                    )
                outcome.append(_count_security_logged(values))
        except Exception:
            log.exception("could not record a security event on its own connection")
        finally:
            connection.close()

    thread = threading.Thread(target=run, name="record-security", daemon=True)
    thread.start()
    thread.join(SEPARATE_RECORD_TIMEOUT)
    if thread.is_alive():
        log.warning("a security event is still being recorded; not waiting for it")
    return outcome[0] if outcome else None


class _SecurityUpsert:
    """The two statements of the upsert, built once per vendor.

    ``UPDATE … RETURNING id`` counts on an existing row; only a kind seen for
    the first time runs ``INSERT … ON CONFLICT DO UPDATE`` (the same SET, for
    two first sightings at once), so a flood of one kind draws no sequence
    value per refusal. Each is one statement: the database evaluates the SET
    on the row as it is when the statement gets it — the latest committed
    version, under its row lock on PostgreSQL; SQLite has one writer at a time
    — so concurrent recorders never lose a count, with no read-modify-write.
    The capped tallies are computed in SQL too (``policy.tally`` is the same
    rule in Python).
    """

    _IDENTITY = ("stream", "category", "key", "source", "severity", "cwe")

    def __init__(self, vendor: str) -> None:
        quote = connection.ops.quote_name
        table = quote(SecurityEvent._meta.db_table)
        self.pg = vendor == "postgresql"

        def col(name: str) -> str:
            return f"{table}.{quote(name)}"

        inet = "::inet" if self.pg else ""
        assignments = [
            f"{quote('count')} = {col('count')} + 1",
            f"{quote('last_seen')} = CASE WHEN {col('last_seen')} > %s "
            f"THEN {col('last_seen')} ELSE %s END",
            f"{quote('detail')} = %s",
            f"{quote('last_ipv4')} = COALESCE(%s{inet}, {col('last_ipv4')})",
            f"{quote('last_ipv6')} = COALESCE(%s{inet}, {col('last_ipv6')})",
        ]
        for tally_column, overflow in (
            ("users", "users_overflow"),
            ("addresses", "addresses_overflow"),
        ):
            counts = col(tally_column)
            if self.pg:
                has = f"({counts} ? %s)"
                size = f"(SELECT count(*) FROM jsonb_object_keys({counts}))"
                bumped = (
                    f"jsonb_set({counts}, ARRAY[%s]::text[], "
                    f"to_jsonb(({counts} ->> %s)::bigint + 1))"
                )
                added = f"{counts} || jsonb_build_object(%s::text, 1)"
            else:
                has = f"EXISTS (SELECT 1 FROM json_each({counts}) AS j WHERE j.key = %s)"
                size = f"(SELECT count(*) FROM json_each({counts}))"
                bumped = (
                    f"json_patch({counts}, json_object(%s, "
                    f"(SELECT j.value FROM json_each({counts}) AS j WHERE j.key = %s) + 1))"
                )
                added = f"json_patch({counts}, json_object(%s, 1))"
            assignments.append(
                f"{quote(tally_column)} = CASE WHEN %s = '' THEN {counts} "
                f"WHEN {has} THEN {bumped} WHEN {size} < %s THEN {added} ELSE {counts} END"
            )
            assignments.append(
                f"{quote(overflow)} = {col(overflow)} + CASE WHEN %s <> '' AND NOT {has} "
                f"AND {size} >= %s THEN 1 ELSE 0 END"
            )
        self.set = ", ".join(assignments)
        identity = " AND ".join(f"{quote(name)} = %s" for name in self._IDENTITY)
        self.update = f"UPDATE {table} SET {self.set} WHERE {identity} RETURNING {quote('id')}"
        json = "::jsonb" if self.pg else ""
        columns = [*self._IDENTITY, "detail", "count", "first_seen", "last_seen", "users",
                   "users_overflow", "addresses", "addresses_overflow", "last_ipv4",
                   "last_ipv6"]  # fmt: skip
        cells = ["%s"] * 7 + ["1", "%s", "%s", f"%s{json}", "0", f"%s{json}", "0"]
        cells += [f"%s{inet}", f"%s{inet}"]
        self.insert = (
            f"INSERT INTO {table} ({', '.join(quote(c) for c in columns)}) "
            f"VALUES ({', '.join(cells)}) "
            f"ON CONFLICT ({', '.join(quote(c) for c in self._IDENTITY)}) DO UPDATE SET {self.set} "
            f"RETURNING {quote('id')}"
        )

    def set_params(self, values: dict[str, Any], now: Any) -> list[Any]:
        params: list[Any] = [now, now, values["detail"], values["ipv4"], values["ipv6"]]
        for actor in (values["user"], values["address"]):
            # The tally's CASE: '' / has / bumped (2) / size / added; then the overflow's:
            # '' / has / size.
            params += [actor, actor, actor, actor, MAX_ACTORS, actor, actor, actor, MAX_ACTORS]
        return params


_security_upserts: dict[str, _SecurityUpsert] = {}


def _count_security(values: dict[str, Any]) -> SecurityEvent:
    vendor = connection.vendor
    if vendor not in _security_upserts:
        _security_upserts[vendor] = _SecurityUpsert(vendor)
    sql = _security_upserts[vendor]
    now = values["now"]
    if not sql.pg:
        now = connection.ops.adapt_datetimefield_value(now)
    identity = [values["identity"][name] for name in sql._IDENTITY]
    set_params = sql.set_params(values, now)
    # In a savepoint when inside a transaction (a test's): a failed statement
    # must not abort the surrounding one on PostgreSQL.
    guard = transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()
    with guard, connection.cursor() as cursor:
        cursor.execute(sql.update, [*set_params, *identity])
        found = cursor.fetchone()
        if found is None:  # the first of its kind (or two at once: ON CONFLICT counts it)
            first = {values["user"]: 1} if values["user"] else {}
            first_address = {values["address"]: 1} if values["address"] else {}
            cursor.execute(
                sql.insert,
                [
                    *identity,
                    values["detail"],
                    now,
                    now,
                    json.dumps(first),
                    json.dumps(first_address),
                    values["ipv4"],
                    values["ipv6"],
                    *set_params,
                ],
            )
            found = cursor.fetchone()
    return SecurityEvent.objects.get(pk=found[0])
