"""Backup, restore, db.copy and integrity.scan against plain loops doing the same I/O.

    python bench/builtin_ops.py [--rows N] [--files F]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_issue7a python bench/builtin_ops.py

Fills ``auth_user`` and ``django_session`` with N rows each, then runs every
operation to completion in this process (``Worker.run_job``: no worker
start-up in the figures) and prints rows/s or files/s next to a baseline
measured in the same run on the same database:

- backup vs. reading the same rows in 1000-row primary-key batches through
  the ORM (``values_list``) — the least a correct backup must do;
- restore (``replace``) vs. deleting the rows and inserting them again with
  ``bulk_create`` in 1000-row transactions;
- db.copy (to a SQLite file, ``var/bench-ops-target.sqlite3``) vs. the same
  read plus ``bulk_create`` on the target;
- integrity.scan of F files of 64 KiB vs. SHA-256 of the same files.

Every operation does more than its baseline on purpose (checksums, a
manifest, reading its own output back, verifying both sides of a copy); the
ratios say what that safety costs. No targets are asserted here.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
TABLES = ["auth.user", "sessions.session"]
OTHERS = ["admin", "auth.group", "auth.permission", "contenttypes", "auth.user_groups",
          "auth.user_user_permissions", "auth.group_permissions"]  # fmt: skip


def configure() -> str:
    sys.path.insert(0, str(BASE_DIR))
    var = BASE_DIR / "var"
    target = var / "bench-ops-target.sqlite3"
    if "DATABASE_URL" not in os.environ:
        os.environ["DATABASE_URL"] = f"sqlite:///{var / 'bench-ops.sqlite3'}"
        _remove_sqlite(var / "bench-ops.sqlite3")
    _remove_sqlite(target)
    os.environ.setdefault("DURABLE_BACKUP_DIR", str(var / "bench-backups"))
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ["DJANGO_SETTINGS_MODULE"] = "recovery.settings"
    from django.conf import settings

    import recovery.settings as site

    site.DATABASES["target"] = {
        **site.DATABASES["default"],
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(target),
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30.0,
            "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL",
        },
    }
    site.STORAGES["bench"] = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(var / "bench-files")},
    }
    import django
    from django.core.management import call_command

    django.setup()
    assert "target" in settings.DATABASES
    call_command("migrate", verbosity=0)
    call_command("migrate", database="target", verbosity=0)
    return os.environ["DATABASE_URL"]


def _remove_sqlite(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def fill(rows: int) -> None:
    from datetime import timedelta

    from django.contrib.auth.models import User
    from django.contrib.sessions.models import Session
    from django.db import transaction
    from django.utils import timezone

    User.objects.all().delete()
    Session.objects.all().delete()
    now = timezone.now()
    for start in range(0, rows, 5000):
        with transaction.atomic():
            User.objects.bulk_create(
                User(
                    username=f"user{n:07d}",
                    email=f"user{n}@example.com",
                    first_name="Ünïcode",
                    last_name=f"Name {n}",
                    password="md5$x$" + "0" * 32,
                    date_joined=now - timedelta(seconds=n),
                )
                for n in range(start, min(start + 5000, rows))
            )
            Session.objects.bulk_create(
                Session(
                    session_key=hashlib.sha1(str(n).encode()).hexdigest(),  # noqa: S324 - test keys
                    session_data="x" * 200,
                    expire_date=now + timedelta(days=1),
                )
                for n in range(start, min(start + 5000, rows))
            )


def specs(alias: str = "default"):
    from durable.builtin.tables import site_tables

    return [s for s in site_tables(alias) if s.label in TABLES]


def read_all(alias: str = "default") -> tuple[int, list]:
    from durable.builtin.tables import batches, read_rows

    by_label = {s.label: s for s in specs(alias)}
    total, kept = 0, []
    for batch in batches(by_label, TABLES, alias, 1000):
        rows = read_rows(by_label[batch.label], alias, batch.after, batch.upto)
        total += len(rows)
        kept.append((batch.label, rows))
    return total, kept


def bulk_write(kept: list, alias: str) -> None:
    from django.db import transaction

    from durable.builtin.tables import decode_rows

    by_label = {s.label: s for s in specs(alias)}
    for spec in by_label.values():
        spec.model._base_manager.using(alias).all().delete()
    for label, rows in kept:
        spec = by_label[label]
        with transaction.atomic(using=alias):
            spec.model._base_manager.using(alias).bulk_create(list(decode_rows(spec, rows)))


def run(operation: str, data: dict) -> float:
    from durable.jobs import enqueue
    from durable.worker import Worker

    job = enqueue(operation, data)
    started = time.perf_counter()
    job = Worker(burst=True, poll_interval=0.05).run_job(job.pk)
    elapsed = time.perf_counter() - started
    if job.state != "completed":
        raise SystemExit(f"{operation} ended {job.state}: {job.reason}")
    return elapsed


def timed(fn, *args) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - started, result


def write_files(root: Path, count: int) -> int:
    shutil.rmtree(root, ignore_errors=True)
    total = 0
    for n in range(count):
        path = root / f"d{n % 50:02d}" / f"f{n:06d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(64 * 1024)
        path.write_bytes(data)
        total += len(data)
    return total


def hash_files(root: Path) -> int:
    count = 0
    for path in sorted(root.rglob("*.bin")):
        hashlib.sha256(path.read_bytes()).hexdigest()
        count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=50_000, help="rows per table (2 tables)")
    parser.add_argument("--files", type=int, default=2000, help="64 KiB files to scan")
    args = parser.parse_args()
    url = configure()
    from django.conf import settings
    from django.db import connection

    print(f"database: {connection.vendor} ({url.split('@')[-1]}); copy target: SQLite file")
    fill(args.rows)
    rows = 2 * args.rows
    exclude = OTHERS
    print(f"data: {rows:,} rows (auth_user + django_session)")

    read_s, (count, kept) = timed(read_all)
    assert count == rows
    print(f"baseline read, 1000-row pk batches: {rows / read_s:,.0f} rows/s ({read_s:.2f}s)")
    shutil.rmtree(settings.DURABLE_BACKUP_DIR, ignore_errors=True)
    backup_s = run("backup.database", {"name": "bench", "exclude": exclude})
    size = sum(p.stat().st_size for p in (Path(settings.DURABLE_BACKUP_DIR) / "bench").iterdir())
    print(
        f"backup.database: {rows / backup_s:,.0f} rows/s ({backup_s:.2f}s, {size / 2**20:.1f} MiB "
        f"on disk); ratio to baseline read {read_s / backup_s:.0%}"
    )

    write_s, _ = timed(bulk_write, kept, "default")
    print(f"baseline delete + bulk_create: {rows / write_s:,.0f} rows/s ({write_s:.2f}s)")
    restore_s = run("restore.database", {"name": "bench", "replace": True, "exclude": exclude})
    print(
        f"restore.database --replace: {rows / restore_s:,.0f} rows/s ({restore_s:.2f}s); "
        f"ratio to baseline write {write_s / restore_s:.0%}"
    )

    copy_base_s, _ = timed(lambda: bulk_write(read_all()[1], "target"))
    print(f"baseline read + bulk_create on the target: {rows / copy_base_s:,.0f} rows/s")
    copy_s = run("db.copy", {"target": "target", "replace": True, "exclude": exclude})
    print(
        f"db.copy (with verification): {rows / copy_s:,.0f} rows/s ({copy_s:.2f}s); "
        f"ratio to baseline {copy_base_s / copy_s:.0%}"
    )

    root = Path(settings.STORAGES["bench"]["OPTIONS"]["location"])
    volume = write_files(root, args.files)
    hash_s, _ = timed(hash_files, root)
    print(
        f"baseline SHA-256 of {args.files} files ({volume / 2**20:.0f} MiB): "
        f"{args.files / hash_s:,.0f} files/s"
    )
    for label in ("first scan (baseline)", "second scan (all ok)"):
        scan_s = run("integrity.scan", {"storage": "bench"})
        print(
            f"integrity.scan, {label}: {args.files / scan_s:,.0f} files/s "
            f"({scan_s:.2f}s); ratio to baseline {hash_s / scan_s:.0%}"
        )
    db_s = run("integrity.scan", {"target": "database"})
    print(f"integrity.scan of the database: {db_s:.2f}s")
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(settings.DURABLE_BACKUP_DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
