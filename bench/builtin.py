"""Schedules, imports and file moves: figures against baselines measured in the same run.

    python bench/builtin.py [--schedules 1000] [--records 100000] [--files 400] [--file-kb 64]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_issue7b python bench/builtin.py

1. ``tick()`` when nothing is due — what every worker pays on each heartbeat —
   with 1 and with ``--schedules`` schedules, against a ``SELECT 1`` round
   trip on the same connection (an ORM lookup by primary key is printed too,
   for scale). Target: within 3x of the round trip, and flat in the number
   of schedules (one index range scan).
2. ``import.jsonl`` and ``import.csv`` of ``--records`` events, run through
   the engine in this process (claim, units, checkpoints), against
   ``recovery.ingest`` of the same JSONL bytes. Target: imports within 2x of
   the ingest's time (same parser, same bulk insert; plus a SHA-256 pass).
3. ``files.move`` of ``--files`` files of ``--file-kb`` KiB between two local
   directories, against ``shutil.copyfile`` + ``os.unlink`` of the same files
   plus the engine's floor for as many units (``durable.noop``: claim, a
   committed checkpoint per unit). Target: within 2x of that sum (the move
   also hashes what it copies, and reads the copy back to verify it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from _setup import configure


def timed(fn, repeat: int) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs (after one warm-up)."""
    fn()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def run_job(operation: str, data: dict) -> tuple[float, object]:
    from durable.jobs import enqueue
    from durable.worker import Worker

    started = time.perf_counter()
    job = enqueue(operation, data, owner="bench")
    job = Worker(burst=True, poll_interval=0.05).run_job(job.pk)
    elapsed = time.perf_counter() - started
    if job.state != "completed":
        raise SystemExit(f"{operation} job {job.pk} ended {job.state}: {job.reason}")
    return elapsed, job


# --- 1. ticks ------------------------------------------------------------------------------


def bench_ticks(count: int) -> None:
    from django.db import connection
    from django.utils import timezone

    from durable.models import Job
    from durable.schedules.models import Schedule
    from durable.schedules.service import add_schedule, tick

    Schedule.objects.all().delete()

    def select_one() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    def orm_lookup() -> None:
        list(Job.objects.filter(pk=0).values_list("pk", flat=True)[:1])

    baseline = timed(select_one, 2000)
    orm = timed(orm_lookup, 2000)
    print(f"{'SELECT 1 round trip (baseline):':44} {baseline * 1e6:8.1f} µs")
    print(f"{'ORM lookup by primary key, for scale:':44} {orm * 1e6:8.1f} µs")
    now = timezone.now()
    add_schedule("bench-0", "durable.noop", every=timedelta(hours=1), now=now)
    one = timed(tick, 2000)
    print(f"{'tick(), nothing due, 1 schedule:':44} {one * 1e6:8.1f} µs  ({one / baseline:.1f}x)")
    later = [now + timedelta(hours=1, seconds=n) for n in range(1, count)]
    Schedule.objects.bulk_create(
        Schedule(name=f"bench-{n}", operation="durable.noop", interval=timedelta(hours=1),
                 next_run_at=when)
        for n, when in enumerate(later, start=1)
    )  # fmt: skip
    with connection.cursor() as cursor:  # what autovacuum would have done by now
        cursor.execute("ANALYZE" if connection.vendor == "sqlite" else "ANALYZE durable_schedule")
    many = timed(tick, 2000)
    label = f"tick(), nothing due, {count:,} schedules:"
    print(f"{label:44} {many * 1e6:8.1f} µs  ({many / baseline:.1f}x)")
    Schedule.objects.all().delete()


# --- 2. imports ------------------------------------------------------------------------------


def write_exports(directory: Path, records: int) -> tuple[Path, Path]:
    jsonl, csv_path = directory / "export.jsonl", directory / "export.csv"
    with open(jsonl, "w") as lines, open(csv_path, "w") as rows:
        rows.write("type,severity,source,db,detail,ts\n")
        for n in range(records):
            detail = f"Backed up wekan.sqlite to backup/2026-11-30 (run {n})"
            ts = f"2026-11-30T10:{(n // 60) % 60:02d}:{n % 60:02d}Z"
            lines.write(json.dumps({"type": "backup-created", "severity": "info",
                                    "source": "startup", "db": "wekan", "detail": detail,
                                    "ts": ts}) + "\n")  # fmt: skip
            rows.write(f'backup-created,info,startup,wekan,"{detail}",{ts}\n')
    return jsonl, csv_path


def reset_events() -> None:
    from django.db import connection

    from durable.models import Job
    from recovery.imports.models import ImportRecord
    from recovery.models import IngestCursor, RecoveryEvent

    if connection.vendor == "postgresql":
        tables = [m._meta.db_table for m in (RecoveryEvent, IngestCursor, ImportRecord, Job)]
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
    else:
        for model in (RecoveryEvent, IngestCursor, ImportRecord, Job):
            model.objects.all().delete()


def bench_imports(records: int, scratch: Path) -> None:
    from django.conf import settings

    from recovery.models import RecoveryEvent

    settings.RECOVERY_IMPORT_DIRS = [str(scratch)]  # imports read only from there
    jsonl, csv_path = write_exports(scratch, records)
    reset_events()
    ingest, _ = run_job("recovery.ingest", {"path": str(jsonl)})
    assert RecoveryEvent.objects.count() == records
    label = f"recovery.ingest, {records:,} lines:"
    print(f"{label:44} {ingest:8.2f} s   ({records / ingest:,.0f} lines/s)")
    for operation, path in (("import.jsonl", jsonl), ("import.csv", csv_path)):
        reset_events()
        elapsed, _ = run_job(operation, {"path": str(path)})
        assert RecoveryEvent.objects.filter(source_line__startswith="imp:").count() == records
        rate = f"{records / elapsed:,.0f} records/s, {elapsed / ingest:.2f}x the ingest"
        label = f"{operation}, {records:,} records:"
        print(f"{label:44} {elapsed:8.2f} s   ({rate})")
        again, _ = run_job(operation, {"path": str(path)})
        label = f"{operation}, the same file again:"
        print(f"{label:44} {again:8.2f} s   (recognised, nothing imported)")
    reset_events()


# --- 3. file moves ---------------------------------------------------------------------------


def make_files(root: Path, count: int, size: int) -> None:
    block = os.urandom(size)
    for n in range(count):
        path = root / f"d{n % 10}" / f"f{n:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(block[n % 251 :] + block[: n % 251])


def bench_moves(count: int, size_kb: int, scratch: Path) -> None:
    from django.conf import settings
    from django.core.files.storage import storages

    src, dst = scratch / "src", scratch / "dst"
    size = size_kb * 1024
    for root in (src, dst):
        root.mkdir()
    make_files(src, count, size)
    started = time.perf_counter()
    for path in sorted(src.rglob("*.bin")):
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        path.unlink()
    baseline = time.perf_counter() - started
    shutil.rmtree(dst)
    dst.mkdir()
    make_files(src, count, size)
    settings.STORAGES = {
        **settings.STORAGES,
        "bench-src": {"BACKEND": "django.core.files.storage.FileSystemStorage",
                      "OPTIONS": {"location": str(src)}},
        "bench-dst": {"BACKEND": "django.core.files.storage.FileSystemStorage",
                      "OPTIONS": {"location": str(dst)}},
    }  # fmt: skip
    storages._storages = {}
    storages._backends = None
    floor, _ = run_job("durable.noop", {"units": count + 1})  # the engine's own cost per unit
    elapsed, _ = run_job("files.move", {"source": "bench-src", "destination": "bench-dst"})
    assert len(list(dst.rglob("*.bin"))) == count
    assert not list(src.rglob("*.bin"))
    mb = count * size / 1e6
    label = f"copy + unlink, {count} x {size_kb} KiB:"
    print(f"{label:44} {baseline:8.2f} s   ({count / baseline:,.0f} files/s)")
    label = f"durable.noop, {count + 1} units (engine floor):"
    print(f"{label:44} {floor:8.2f} s   ({(count + 1) / floor:,.0f} units/s)")
    label = f"files.move, {count} x {size_kb} KiB:"
    rate = f"{count / elapsed:,.0f} files/s, {mb / elapsed:,.1f} MB/s"
    ratio = elapsed / (baseline + floor)
    print(f"{label:44} {elapsed:8.2f} s   ({rate}, {ratio:.1f}x copy + engine floor)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--file-kb", type=int, default=64)
    args = parser.parse_args()
    url = configure("bench-builtin.sqlite3")
    print(f"database: {url.split('@')[-1]}")
    bench_ticks(args.schedules)
    with tempfile.TemporaryDirectory(prefix="bench-builtin-") as scratch:
        bench_imports(args.records, Path(scratch))
        bench_moves(args.files, args.file_kb, Path(scratch))


if __name__ == "__main__":
    main()
