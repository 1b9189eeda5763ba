"""What the engine asks of a database, by name: the interface each vendor's module fills in.

``durable.lease``, ``durable.jobs`` and ``durable.rescue`` call these methods
and never look at the vendor; ``durable.sql.statements()`` picks the vendor's
class once per process. A method runs its vendor's named statements on the
cursor it is given (one statement on PostgreSQL where SQLite needs two or
three) or returns a statement with its parameters for the caller to run.

Two placeholders are in use. Statements for Django's cursor take ``%s``; the
hot path (claims, unit commits, the last unit's commit) runs on the driver's
own cursor (``conn.connection.cursor()``), whose placeholder is ``%s`` for
psycopg and ``?`` for sqlite3. Each statement says which cursor it is for.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any, ClassVar, NamedTuple, Protocol, TypeVar

from django.db import DEFAULT_DB_ALIAS
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, JSONField
from django.db.models.base import ModelState
from django.db.models.expressions import Col
from django.db.models.signals import post_init, pre_init

from ..models import Job, JobEvent, PausedQueue, UnitResult
from ..models.jobs import UNIQUE_KEY_STATES
from ..states import LEASED_STATES

BUSY = "busy"  # renew_unless_busy: the row is locked; the lease is still ours

# A row as a driver returns it: its values are whatever the columns hold.
Row = tuple[Any, ...]
# A timestamp as a driver takes it: a datetime (psycopg) or Django's text (sqlite3).
Stamp = datetime | str | None
T = TypeVar("T")


class NextClaim(NamedTuple):
    """A claim to make in the transaction that finishes a job: the finishing thread's
    next job, from this worker's queues and operations (``durable.lease.finish_unit``)."""

    owner: str
    queues: list[str]
    operations: list[str]
    lease_seconds: float


class Cursor(Protocol):
    """The part of a DB-API cursor (or Django's wrapper of one) the statements use."""

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> object: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> Any: ...


def quote(name: str) -> str:
    """A table or column name as both vendors quote it (Django's ``quote_name``)."""
    return f'"{name}"'


def placeholders(values: Sequence[object]) -> str:
    return ", ".join(["%s"] * len(values))


# The tables, quoted once: the statements of both vendors are built from these.
JOB = quote(Job._meta.db_table)
EVENTS = quote(JobEvent._meta.db_table)
RESULTS = quote(UnitResult._meta.db_table)
PAUSED = quote(PausedQueue._meta.db_table)
# The states in which a worker holds a lease, as an SQL list: every fenced write's condition.
LEASED = ", ".join(f"'{state}'" for state in sorted(str(state) for state in LEASED_STATES))
# The claim returns whole rows; these columns, in the model's order, make them Jobs again.
JOB_FIELDS: list[Field[Any, Any]] = list(Job._meta.concrete_fields)
JOB_COLUMNS = ", ".join(quote(field.column) for field in JOB_FIELDS)
JOB_ATTNAMES = [field.attname for field in JOB_FIELDS]
# Where a column's value sits in a claimed row.
COLUMN_INDEX = {name: n for n, name in enumerate(JOB_ATTNAMES)}
# enqueue: the columns every job of one INSERT shares (the input and unique key vary).
SHARED_FIELDS: list[Field[Any, Any]] = [
    field for field in JOB_FIELDS if field.name not in ("id", "input", "unique_key")
]
SHARED_COLUMNS = ", ".join(quote(field.column) for field in SHARED_FIELDS)
# enqueue() outside a transaction (``insert_job``): one job's columns, the shared ones
# first, then the input (JSON text) and the unique key.
_BY_NAME = {field.name: field for field in JOB_FIELDS}
INSERT_FIELDS: list[Field[Any, Any]] = [*SHARED_FIELDS, _BY_NAME["input"], _BY_NAME["unique_key"]]
INSERT_COLUMNS = ", ".join(quote(field.column) for field in INSERT_FIELDS)
# The columns in which a new job differs from the model's defaults: every other
# column's value is adapted once per process (``Statements.job_values``).
ENQUEUE_VARYING = (
    "operation", "owner", "tenant", "queue", "priority", "on_restart", "max_attempts",
    "next_attempt_at", "event_seq", "trace_context", "created_at", "updated_at",
)  # fmt: skip
# The unfinished jobs holding some unique keys, with the unique index's condition
# written out literally: SQLite reads the partial index for it then, where the ORM's
# ``state IN (%s, …)`` (parameters) made it scan the whole table. ``{keys}``: the
# keys' placeholders (Django's).
KEY_HOLDERS = (
    f"SELECT {JOB_COLUMNS} FROM {JOB} WHERE unique_key IN ({{keys}}) AND state IN ("
    + ", ".join(f"'{state}'" for state in UNIQUE_KEY_STATES)
    + ")"
)
ORDER = "ORDER BY priority DESC, next_attempt_at, id"  # the claim's order, durable_job_due's


def _json_value(value: Any) -> Any:
    """A JSON column's text as ``JSONField.from_db_value`` reads it (text it cannot parse
    stays text)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _converted(
    value: Any, *, found: list[Callable[..., Any]], col: Col, conn: BaseDatabaseWrapper
) -> Any:
    for convert in found:
        value = convert(value, col, conn)
    return value


class Statements(ABC):
    """The engine's SQL for one vendor; ``durable.sql.statements()`` gives the one in use."""

    vendor: ClassVar[str]
    # A job is not claimed from a paused queue (durable.queues): one more condition of the
    # pick, so no query per claim. Each vendor words it as its planner reads it best.
    queue_not_paused: ClassVar[str]
    # The unit commit's two statements, for the driver's cursor inside a transaction the
    # caller holds (an atomic unit, or a commit with events to number):
    #   commit_unit_sql: [checkpoint JSON, units_total, now, events, *extend, *fenced]
    #     RETURNING state, event_seq; ``extend`` is ``commit_params``' lease extension
    #   insert_result_sql: [job_id, key, result JSON, now]
    commit_unit_sql: ClassVar[str]
    insert_result_sql: ClassVar[str]

    def __init__(self) -> None:
        self._readers: list[Callable[[Any], Any] | None] | None = None
        self._job_defaults: list[Any] | None = None

    # --- claim --------------------------------------------------------------------

    def _pick_filters(
        self,
        queues: Sequence[str],
        operations: Sequence[str],
        job_id: int | None,
        *,
        per_queue: bool,
    ) -> tuple[list[str], list[Any]]:
        """The pick's conditions after "queued and due": which job, queues, operations."""
        where: list[str] = []
        params: list[Any] = []
        if job_id is not None:
            where.append("id = %s")
            params.append(job_id)
        else:
            if per_queue:
                where.append("queue = q.name")
            else:
                where.append(f"queue IN ({placeholders(queues)})")
                params.extend(queues)
            where.append(self.queue_not_paused)  # a paused queue is not claimed from
        where.append(f"operation IN ({placeholders(operations)})")
        params.extend(operations)
        return where, params

    @abstractmethod
    def pick(
        self,
        now: datetime | None,
        *,
        queues: Sequence[str],
        operations: Sequence[str],
        job_id: int | None = None,
        lock: bool = True,
        limit: int = 1,
    ) -> tuple[str, list[Any]]:
        """The SELECT of the next ``limit`` due jobs' ids (Django's placeholders).

        ``lock=False``: a plain read (the wake-up's "is anything due?").
        """

    @abstractmethod
    def claim(
        self,
        now: datetime,
        *,
        owner: str,
        queues: Sequence[str],
        operations: Sequence[str],
        lease_seconds: float,
        job_id: int | None = None,
        count: int = 1,
    ) -> tuple[str, list[Any]]:
        """The claim's UPDATE with its parameters (Django's placeholders), ``now`` read
        under the lock. Its rows are whole jobs, each followed by ``has_results``."""

    @abstractmethod
    def claim_rows(
        self,
        cursor: Cursor,
        now: datetime,
        *,
        owner: str,
        queues: Sequence[str],
        operations: Sequence[str],
        lease_seconds: float,
        job_id: int | None,
        count: int,
        driver: bool,
    ) -> list[Row]:
        """Claim: the claimed rows (see ``claim``) with their ``started`` events written.

        ``driver``: ``cursor`` is the driver's own, not Django's.
        """

    def job_from_row(self, conn: BaseDatabaseWrapper, row: Row) -> Job:
        """A claimed row (``JOB_COLUMNS``) as the Job the ORM would have read.

        Built as ``Model.from_db`` would, without ``Model.__init__``: its field-by-field
        defaults and descriptors cost more than a one-unit job's statements. The
        values go straight into the instance's ``__dict__``, which is where
        ``__init__`` puts them too. A site with ``pre_init``/``post_init`` receivers
        for jobs gets the ORM's construction, and its signals.
        """
        readers = self._readers
        if readers is None:
            readers = self._readers = [self.column_reader(conn, field) for field in JOB_FIELDS]
        values = [
            value if read is None or value is None else read(value)
            for value, read in zip(row, readers, strict=True)
        ]
        if pre_init.has_listeners(Job) or post_init.has_listeners(Job):
            return Job.from_db(DEFAULT_DB_ALIAS, JOB_ATTNAMES, values)
        job = Job.__new__(Job)
        job.__dict__.update(zip(JOB_ATTNAMES, values, strict=True))
        state = ModelState()
        state.adding, state.db = False, DEFAULT_DB_ALIAS
        job._state = state
        return job

    def column_reader(
        self, conn: BaseDatabaseWrapper, field: Field[Any, Any]
    ) -> Callable[[Any], Any] | None:
        """What turns a claimed column's non-NULL value into the field's; None: as it is.

        Django's converters for the column, run in turn; a JSON column without a
        decoder of its own is ``json.loads`` (what ``JSONField.from_db_value`` does
        for a plain column). A vendor may read its own columns faster.
        """
        col = field.get_col(Job._meta.db_table)
        found = conn.ops.get_db_converters(col) + col.get_db_converters(conn)
        if not found:
            return None
        if isinstance(field, JSONField) and field.decoder is None and len(found) == 1:
            return _json_value
        return partial(_converted, found=found, col=col, conn=conn)

    # --- one transaction on the driver's cursor -------------------------------------

    @abstractmethod
    def write(self, conn: BaseDatabaseWrapper, run: Callable[[Cursor], T | None]) -> T | None:
        """``run(cursor)`` on the driver's cursor as one transaction, Django's connection
        being in autocommit mode; ``run`` returning None rolls it back (a lost lease).

        Errors come out as Django's database exceptions.
        """

    # --- renewal -----------------------------------------------------------------

    @abstractmethod
    def renew(
        self, cursor: Cursor, now: datetime, fenced: Sequence[Any], seconds: float
    ) -> str | None:
        """Extend the lease ``fenced`` (id, owner, epoch) by ``seconds`` from ``now`` (read
        under the lock); the job's state, or None when the lease is gone. Django's cursor."""

    @abstractmethod
    def renew_unless_busy(
        self, cursor: Cursor, now: datetime, fenced: Sequence[Any], seconds: float
    ) -> str | None:
        """``renew``, but ``BUSY`` instead of waiting when the row is locked."""

    # --- unit commits --------------------------------------------------------------

    @abstractmethod
    def timestamp(self, conn: BaseDatabaseWrapper, moment: datetime) -> Stamp:
        """``moment`` as the driver's cursor takes a timestamp."""

    @abstractmethod
    def commit_params(
        self,
        conn: BaseDatabaseWrapper,
        moment: datetime,
        fixed: tuple[str, int | None, int],
        fenced: Sequence[Any],
        lease_seconds: float | None,
    ) -> tuple[list[Any], Stamp]:
        """``commit_unit_sql``'s parameters and the commit's timestamp, from ``moment``
        (read under the lock). ``fixed``: checkpoint JSON, units_total, number of events.
        ``lease_seconds`` None keeps the lease's expiry as it is."""

    @abstractmethod
    def commit_unit(self, cursor: Cursor, params: list[Any], result: list[Any]) -> Row | None:
        """The unit commit when it is a transaction of its own: ``commit_unit_sql`` and
        ``insert_result_sql``'s writes. ``result``: [key, result JSON, now]. Returns
        (state, event_seq), or None for a lost lease (then nothing is written)."""

    @abstractmethod
    def finish_unit(self, cursor: Cursor, params: list[Any], result: list[Any]) -> Row | None:
        """The last unit's commit, which also ends the job: checkpoint, unit result, the
        state ``complete()`` would leave and its event (``durable.endings.finished``).

        ``params``: [checkpoint JSON, units_total, now, now, *fenced]; ``result``:
        [key, result JSON, now]. Returns (state, event_seq, units_done), or None for
        a lost lease. Reaches the fault point ``finish_before_commit``.
        """

    @abstractmethod
    def finish_and_claim(
        self,
        cursor: Cursor,
        params: list[Any],
        result: list[Any],
        moment: datetime,
        then: NextClaim,
    ) -> tuple[Row, list[Row]] | None:
        """``finish_unit`` and, in the same transaction, the claim of ``then``'s next job,
        made only if the finish applied (a lost lease claims nothing).

        ``moment``: the finish's time (read under the lock), the claim's too. Returns
        the finish's (state, event_seq, units_done) and the claimed rows (as
        ``claim_rows``': whole jobs, each followed by ``has_results``; the ``started``
        event written), or None for a lost lease. Reaches ``finish_before_commit``.
        """

    # --- enqueue, worker registration ---------------------------------------------------

    @abstractmethod
    def insert_jobs(
        self, cursor: Cursor, *, values: list[Any], payload: str, facts: str, created: Stamp
    ) -> list[int]:
        """Insert one job per element of ``payload`` (a JSON array of [input, unique_key])
        sharing ``values`` (``SHARED_FIELDS``), with their ``enqueued`` events carrying
        ``facts``; the new ids, in the array's order. Django's cursor."""

    def key_holders(self, keys: Sequence[str]) -> tuple[str, list[str]]:
        """The SELECT of the unfinished jobs holding ``keys`` (whole rows, for
        ``Job.objects.raw``) and its parameters. At most one job per key."""
        return KEY_HOLDERS.replace("{keys}", placeholders(keys)), list(keys)

    def job_values(self, conn: BaseDatabaseWrapper, job: Job, encoded_input: str) -> list[Any]:
        """``insert_job``'s values for a new ``job`` (``INSERT_FIELDS``), as the driver takes them.

        Django adapts each of a row's 29 values on every save (~7 µs each); all
        but ``ENQUEUE_VARYING`` are the model's defaults, adapted here once per
        process. The varying ones are text, whole numbers and timestamps, adapted
        directly. ``encoded_input``: the input's JSON text (``clean_and_encode``).
        """
        if self._job_defaults is None:
            template = Job()
            self._job_defaults = [
                field.get_db_prep_save(field.pre_save(template, True), conn)
                for field in SHARED_FIELDS
            ]
        values = [*self._job_defaults, encoded_input, job.unique_key]
        for index, attname, kind in _VARYING:
            value = getattr(job, attname)
            if kind == "time":
                values[index] = self.timestamp(conn, value)
            elif kind == "text":
                values[index] = str(value)  # a TextChoices member as its plain value
            else:
                values[index] = int(value)
        return values

    @abstractmethod
    def insert_job(
        self, conn: BaseDatabaseWrapper, values: list[Any], facts: str, created: Stamp
    ) -> int:
        """One job (``values``: ``job_values``) and its ``enqueued`` event carrying ``facts``,
        committed as a transaction of their own on the driver's cursor; the new id.

        Only outside any transaction, Django's connection in autocommit mode. A unique
        key already taken raises Django's ``IntegrityError`` and writes nothing.
        """

    @abstractmethod
    def serialize_registration(self, conn: BaseDatabaseWrapper) -> None:
        """Inside a transaction: wait until no other worker is registering (so that of
        several workers starting together exactly one sees a cold start)."""


def _kind(field: Field[Any, Any]) -> str:
    if field.get_internal_type() == "DateTimeField":
        return "time"
    if field.get_internal_type() in ("CharField", "TextField"):
        return "text"
    return "int"


# Where each of ENQUEUE_VARYING sits in INSERT_FIELDS, and how the driver takes it.
_VARYING = [
    (INSERT_FIELDS.index(_BY_NAME[name]), name, _kind(_BY_NAME[name])) for name in ENQUEUE_VARYING
]
