"""recovery-events.jsonl ingest: lines per second, and the cost of a small append.

    python bench/ingest.py [--lines 1000000] [--append 10] [--small 100] [--rounds 5]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_issue4 python bench/ingest.py

1. Writes a file of ``--lines`` realistic lines (~170 bytes each, the shape
   of docs/how-to/feed-recovery-events.md, a few with actors, addresses and
   affected objects, 1 in 1,000 malformed) and imports it with the
   ``recovery.ingest`` job, run in this process through the engine (claim,
   units, checkpoints — what a worker does).
   Target: >= 100,000 lines/s on SQLite. Says whether the Recovery search index
   is in that figure: PostgreSQL maintains it in the inserting statements
   (included); SQLite defers it to a job of its own, timed after the import,
   with both figures and their sum printed.
2. Appends ``--append`` lines and times the import of just those, ``--rounds``
   times; then the same on a ``--small``-line file. Target: the big file's
   time within 2x of the small file's (only new bytes are read).
3. Prints the query plans and times of the Recovery report's first pages on
   the imported rows (newest first, Done, Failed, Deleted, a keyset page).

In the same run, the same rows (parsed beforehand, not timed) are bulk-inserted
into an unindexed table of the events' shape, as fast as the database takes
them: binary ``COPY`` on PostgreSQL (the import's own way in, so the ratio
compares like with like), one ``executemany`` transaction on SQLite. Then
``ratio_to_raw=R`` is the import's rate (with everything the Recovery report
needs: search index and day counts — on SQLite the deferred search index job
counts in its time) over that raw rate. Target: R >= 0.33.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC
from pathlib import Path

from _setup import BASE_DIR, configure

TYPES = ["backup-created", "backup-verified", "integrity-ok", "bloat-repaired", "remigrate"]


def write_lines(path: Path, start: int, count: int, mode: str = "a") -> int:
    """``count`` lines numbered from ``start``; every 1,000th is malformed on purpose.

    Returns how many are valid.
    """
    chunks = []
    valid = 0
    for n in range(start, start + count):
        if n % 1000 == 999:
            chunks.append('{"type": "cut short\n')
            continue
        valid += 1
        kind = TYPES[n % len(TYPES)]
        line = (
            f'{{"type":"{kind}","db":"wekan","severity":"{"warning" if n % 50 == 0 else "info"}",'
            f'"source":"startup","detail":"Backed up wekan.sqlite to backup/2026-11-30 '
            f'(run {n})","ts":"2026-11-30T10:{(n // 60) % 60:02d}:{n % 60:02d}Z"'
        )
        if n % 100 == 0:
            line += (
                f',"done":false,"deleted_data":true,"userId":"u{n % 7}","username":"admin",'
                f'"ip":"::ffff:192.0.2.{n % 250}","boardIds":["b{n}"],"boardTitles":["Board {n}"]'
            )
        chunks.append(line + "}\n")
    with open(path, mode) as handle:
        handle.write("".join(chunks))
    return valid


def ingest(path: Path) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process, job) for one ingest run."""
    from durable.worker import Worker
    from recovery.receivers import enqueue_ingest

    started, cpu = time.perf_counter(), time.process_time()
    job = enqueue_ingest(str(path), owner="bench")
    job = Worker(burst=True, poll_interval=0.05).run_job(job.pk)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    if job.state != "completed":
        raise SystemExit(f"ingest job {job.pk} ended {job.state}: {job.reason}")
    return elapsed, cpu, job


def catch_up_search_index() -> tuple[int, float] | None:
    """SQLite defers the dashboard's search index and day counts to a job of their own.

    Runs that job to the end: (events indexed, seconds), or None where the
    index is maintained by the inserts themselves (PostgreSQL).
    """
    from django.db import connection

    from durable.worker import Worker
    from recovery.dashboard import indexing, sql

    if not sql.deferred(connection):
        return None
    waiting = sql.pending(connection)
    started = time.perf_counter()
    job = Worker(burst=True, poll_interval=0.05).run_job(
        indexing.request_catch_up("bench", at_least=1).pk
    )
    elapsed = time.perf_counter() - started
    if job.state != "completed" or sql.pending(connection):
        raise SystemExit(f"search index job {job.pk} ended {job.state}: {job.reason}")
    return waiting, elapsed


RAW_TABLE = "bench_raw_events"


def raw_rows(path: Path) -> tuple[list[str], list[tuple]]:
    """The rows the ingest inserts for ``path``'s lines: (columns, rows), parsed here."""
    import json

    from django.db import connection
    from django.utils import timezone

    from recovery.parsing import parse_chunk

    now = timezone.now()
    sqlite = connection.vendor == "sqlite"
    recorded = connection.ops.adapt_datetimefield_value(now) if sqlite else now
    columns = [
        "type", "severity", "source", "db", "detail", "done", "deleted_data", "user_id",
        "username", "ipv4", "ipv6", "object_ids", "object_titles", "object_count", "ts",
        "recorded_at", "source_line", "operation", "reason", "reclaimed",
    ]  # fmt: skip
    chunk = parse_chunk(path.read_bytes(), offset=0, crc=0, max_lines=10**9)
    if not sqlite:  # binary COPY rows, exactly as the import writes them
        from recovery.records import lines

        return list(lines._COPY_TYPES), list(lines._copy_rows(chunk.events, "raw:", now))
    rows = []
    for offset, crc, event in chunk.events:
        ts = event[14]
        if sqlite and ts is not None:
            ts = str(ts.astimezone(UTC))[:-6]
        ids = json.dumps(list(event[11])) if event[11] else None
        titles = json.dumps(list(event[12])) if event[12] else None
        key = f"raw:{offset:012x}:{crc:08x}"
        rows.append((*event[:11], ids, titles, event[13], ts, recorded, key, "", "", False))
    return columns, rows


def raw_bulk_insert(path: Path) -> tuple[int, float]:
    """(rows, seconds): the same rows into an unindexed table, as fast as the database can.

    The baseline of ``ratio_to_raw``: no keys, no indexes, no triggers, one
    transaction; binary ``COPY`` on PostgreSQL, ``executemany`` on SQLite.
    """
    from django.db import connection, transaction

    columns, rows = raw_rows(path)
    names = ", ".join(columns)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
        if connection.vendor == "postgresql":
            cursor.execute(
                f"CREATE TABLE {RAW_TABLE} (LIKE recovery_recoveryevent "
                "INCLUDING DEFAULTS INCLUDING IDENTITY)"
            )
        else:
            cursor.execute(f"CREATE TABLE {RAW_TABLE} AS SELECT * FROM recovery_recoveryevent "
                           "WHERE 0")  # fmt: skip
    connection.ensure_connection()
    raw = connection.connection
    try:
        started = time.perf_counter()
        if connection.vendor == "postgresql":
            import psycopg

            from recovery.records import lines

            statement = f"COPY {RAW_TABLE} ({names}) FROM STDIN (FORMAT binary)"
            with (
                transaction.atomic(),
                psycopg.Cursor(raw) as cursor,
                cursor.copy(statement) as copy,
            ):
                copy.set_types(list(lines._COPY_TYPES.values()))
                for row in rows:
                    copy.write_row(row)
        else:
            cursor = raw.cursor()
            marks = ", ".join("?" * len(columns))
            with transaction.atomic():
                cursor.executemany(f"INSERT INTO {RAW_TABLE} ({names}) VALUES ({marks})", rows)
            cursor.close()
        elapsed = time.perf_counter() - started
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
    return len(rows), elapsed


def append_rounds(path: Path, first: int, count: int, rounds: int) -> tuple[list[float], int]:
    times, valid = [], 0
    for round_ in range(rounds):
        valid += write_lines(path, first + round_ * count, count)
        elapsed, _, _ = ingest(path)
        times.append(elapsed)
    return times, valid


def reset() -> None:
    from django.db import connection

    from durable.models import Job
    from recovery.models import IngestCursor, IngestPath, RecoveryEvent

    models = (RecoveryEvent, IngestPath, IngestCursor, Job)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            tables = ", ".join(model._meta.db_table for model in models)
            cursor.execute(f"TRUNCATE {tables} CASCADE")
    else:
        for model in models:
            model.objects.all().delete()


def report_queries() -> None:
    from django.db import connection

    from recovery.models import RecoveryEvent

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {RecoveryEvent._meta.db_table}")
    else:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    middle = RecoveryEvent.objects.order_by("id").values_list("id", flat=True)[
        RecoveryEvent.objects.count() // 2
    ]
    queries = {
        "newest first": RecoveryEvent.objects.newest_first(),
        "done": RecoveryEvent.objects.done().newest_first(),
        "failed": RecoveryEvent.objects.failed().newest_first(),
        "deleted": RecoveryEvent.objects.deleted().newest_first(),
        "keyset page (middle)": RecoveryEvent.objects.newest_first().before(middle),
        "failed, keyset page": RecoveryEvent.objects.failed().newest_first().before(middle),
    }
    print("Recovery report queries (10 rows) on the imported table:")
    for name, queryset in queries.items():
        page = queryset[:10]
        times = []
        for _ in range(7):
            started = time.perf_counter()
            list(queryset.all()[:10])  # a fresh queryset: no result cache
            times.append((time.perf_counter() - started) * 1000)
        plan = " / ".join(
            line.strip() for line in page.explain().splitlines() if "Limit" not in line
        )
        print(f"  {name:22} median {statistics.median(times):6.2f} ms   {plan[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--append", type=int, default=10)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    url = configure("bench-ingest.sqlite3")
    from django.db import connection

    from recovery.dashboard import sql
    from recovery.models import RecoveryEvent
    from recovery.operations import job_summary

    print(f"database: {connection.vendor} ({url.split('@')[-1]})")
    reset()
    work = BASE_DIR / "var" / "bench-ingest"
    work.mkdir(parents=True, exist_ok=True)
    big, small = work / "big.jsonl", work / "small.jsonl"
    try:
        started = time.perf_counter()
        valid = write_lines(big, 0, args.lines, mode="w")
        valid += write_lines(small, 0, args.small, mode="w")
        size = big.stat().st_size
        print(
            f"file: {args.lines:,} lines, {size / 1e6:,.1f} MB "
            f"({size / args.lines:.0f} B/line), written in {time.perf_counter() - started:.1f} s"
        )

        elapsed, cpu, job = ingest(big)
        summary = job_summary(job.pk)
        rows = RecoveryEvent.objects.filter(source_line__isnull=False).count()
        included = "not included: SQLite defers it" if sql.deferred(connection) else "included"
        print(
            f"full import: {elapsed:.2f} s = {args.lines / elapsed:,.0f} lines/s "
            f"({summary['imported']:,} imported, {sum(summary['skipped'].values()):,} skipped, "
            f"{job.units_done} units); search index {included}; "
            "target >= 100,000 lines/s on SQLite"
        )
        print(
            f"  CPU time of this process: {cpu:.2f} s = {args.lines / cpu:,.0f} lines per "
            "CPU-second (wall time also waits for the CPU and, on PostgreSQL, the server)"
        )
        if rows != summary["imported"]:
            raise SystemExit(f"{rows} rows for {summary['imported']} imported lines")
        indexed = catch_up_search_index()
        if indexed is None:
            print("search index and day counts: maintained by the inserts (in the figure above)")
        else:
            waiting, index_seconds = indexed
            both = elapsed + index_seconds
            print(
                f"search index job (afterwards, a job of its own): {waiting:,} events in "
                f"{index_seconds:.2f} s = {waiting / index_seconds:,.0f} events/s"
            )
            print(
                f"import and search index together: {both:.2f} s = {args.lines / both:,.0f} lines/s"
            )
            elapsed = both
        rows, raw_seconds = raw_bulk_insert(big)
        how = "binary COPY" if connection.vendor == "postgresql" else "one executemany transaction"
        print(
            f"raw bulk insert of the same {rows:,} rows into an unindexed table ({how}): "
            f"{raw_seconds:.2f} s = {rows / raw_seconds:,.0f} rows/s"
        )
        ratio = (summary["imported"] / elapsed) / (rows / raw_seconds)
        print(
            f"ratio_to_raw={ratio:.2f} (the import with search index and day counts, "
            "over the raw insert; target >= 0.33)"
        )

        ingest(small)
        big_times, more = append_rounds(big, args.lines, args.append, args.rounds)
        small_times, even_more = append_rounds(small, args.small, args.append, args.rounds)
        valid += more + even_more
        big_median, small_median = statistics.median(big_times), statistics.median(small_times)
        print(
            f"{args.append} appended lines: {big_median * 1000:.1f} ms after {args.lines:,} lines, "
            f"{small_median * 1000:.1f} ms after {args.small} lines (medians of {args.rounds}); "
            f"ratio {big_median / small_median:.2f} (target <= 2)"
        )
        imported = RecoveryEvent.objects.filter(source_line__isnull=False).count()
        if imported != valid:
            raise SystemExit(f"{imported:,} lines imported, {valid:,} expected")
        report_queries()

    finally:  # 170 MB of scratch data
        big.unlink(missing_ok=True)
        small.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
