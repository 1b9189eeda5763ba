"""A database outage under load: how much the workers log, how soon work resumes, what is kept.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME python bench/outage.py
        [--first 8] [--second 40] [--workers 3] [--lease 30]

Three ``runworker`` processes (``--concurrency 2``, ``--lease-seconds 30``) and a
client that enqueues three ``test.rows`` jobs a second (4 atomic units of 0.25 s
each; every unit writes one row, the exactly-once evidence) connect to
PostgreSQL through a TCP relay on loopback that this script controls
(``tests.relay``). Twice it cuts every connection at once and refuses new ones:
for ``--first`` seconds (8), then for ``--second`` (40, longer than the lease).
The client retries an enqueue that failed, with the same ``unique_key``.

Printed, per outage and per worker: the log records written from the cut to 5 s
after the return (the jobs' own state changes aside), how many lines were not
one record each (a traceback's lines), and the levels; per outage, how long
after the return the first unit committed ("resume"). At the end: every job
completed, each unit's row exactly once, no attempt spent, every worker still
running, and the log lines in all. Targets:
at most a warning, a reminder a minute and a return line per worker per outage,
no traceback, resume within 2 s.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

from _setup import BASE_DIR, configure

UNITS, UNIT_SECONDS, RATE = 4, 0.25, 3.0
LINE = re.compile(r"^time=(\S+) level=(\w+) logger=(\S+)")
# The jobs' own state changes (enqueued, started, completed, reclaimed...): the work
# going on, not what the outage made the worker say.
WORK = re.compile(r"^durable\.(jobs|op\..*)$")


class Client(threading.Thread):
    """Enqueues ``RATE`` jobs a second through the relay until told to stop."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.keys: list[str] = []
        self.failed_enqueues = 0

    def run(self) -> None:
        from django.db import connection

        from durable.jobs import enqueue
        from durable.models import Job

        # This thread's connection only: through the relay (the others stay direct).
        connection.settings_dict = {**connection.settings_dict, "PORT": self.port}
        n = 0
        while not self.stop.is_set():
            key = f"outage-bench-{n}"
            while not self.stop.is_set():
                try:
                    if not Job.objects.filter(unique_key=key).exists():
                        enqueue(
                            "test.rows",
                            {"units": UNITS, "sleep": UNIT_SECONDS},
                            unique_key=key,
                        )
                    break
                except Exception:
                    self.failed_enqueues += 1
                    connection.close()
                    time.sleep(0.2)
            self.keys.append(key)
            n += 1
            self.stop.wait(1.0 / RATE)
        connection.close()


def start_workers(count: int, port: int, lease: float, logs: Path) -> list[subprocess.Popen]:
    name = os.environ["DATABASE_URL"].rsplit("/", 1)[1]
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/{name}",
        "LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    }
    procs = []
    for n in range(count):
        log = (logs / f"worker-{n}.log").open("w")
        cmd = [sys.executable, "manage.py", "runworker", "--concurrency", "2"]
        cmd += ["--lease-seconds", str(lease), "--poll-interval", "1"]
        procs.append(subprocess.Popen(cmd, cwd=BASE_DIR, env=env, stdout=log, stderr=log))
    return procs


def window(path: Path, start: float, end: float) -> tuple[int, int, Counter]:
    """(records, lines not a record of their own, levels) written in [start, end], the
    jobs' state changes aside."""
    records, loose, levels = 0, 0, Counter()
    inside = False
    for line in path.read_text(errors="replace").splitlines():
        match = LINE.match(line)
        if match is None:
            loose += inside  # a traceback's line, or any other continuation
            continue
        at = datetime.fromisoformat(match.group(1)).replace(tzinfo=UTC).timestamp()
        inside = start - 1 <= at <= end  # logfmt times have whole seconds
        if inside and not WORK.match(match.group(3)):
            records += 1
            levels[match.group(2)] += 1
    return records, loose, levels


def first_unit_after(moment: float) -> float | None:
    from tests.testapp.models import SideEffect

    after = datetime.fromtimestamp(moment, tz=UTC)
    first = SideEffect.objects.filter(created_at__gt=after).order_by("created_at").first()
    return None if first is None else first.created_at.timestamp() - moment


def outage(relay, seconds: float) -> tuple[float, float]:
    cut_at = time.time()
    cut = relay.cut()
    print(f"cut {cut} connections; refusing for {seconds:g} s", flush=True)
    time.sleep(seconds)
    relay.restore()
    return cut_at, time.time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--first", type=float, default=8.0)
    parser.add_argument("--second", type=float, default=40.0)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--lease", type=float, default=30.0)
    args = parser.parse_args()
    configure("unused.sqlite3")
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", run_syncdb=True, verbosity=0)  # the test app's table

    from durable.models import Job
    from tests.relay import Relay
    from tests.testapp.models import SideEffect

    if connection.vendor != "postgresql":
        raise SystemExit("the relay cuts TCP connections: set DATABASE_URL=postgres://…")
    Job.objects.all().delete()
    SideEffect.objects.all().delete()
    logs = BASE_DIR / "var" / "bench-outage"
    logs.mkdir(parents=True, exist_ok=True)
    relay = Relay(int(connection.settings_dict.get("PORT") or 5432))
    procs = start_workers(args.workers, relay.port, args.lease, logs)
    client = Client(relay.port)
    client.start()
    outages = []
    try:
        time.sleep(8)
        outages.append(outage(relay, args.first))
        time.sleep(15)
        outages.append(outage(relay, args.second))
        time.sleep(10)
        client.stop.set()
        client.join(30)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if (
                not Job.objects.filter(unique_key__startswith="outage-bench-")
                .exclude(state="completed")
                .exists()
            ):
                break
            time.sleep(0.5)
        alive = [proc.poll() is None for proc in procs]
        report(procs, logs, outages, client, alive)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
        relay.close()


def report(procs, logs: Path, outages, client: Client, alive: list[bool]) -> None:
    from django.db.models import Count

    from durable.models import Job
    from tests.testapp.models import SideEffect

    for n, (cut_at, back_at) in enumerate(outages, 1):
        resume = first_unit_after(back_at)
        shown = "none" if resume is None else f"{resume:.2f} s"
        print(
            f"outage {n}: {back_at - cut_at:.1f} s; first unit committed after the return: {shown}"
        )
        for w in range(len(procs)):
            records, loose, levels = window(logs / f"worker-{w}.log", cut_at, back_at + 5)
            print(
                f"  worker {w}: {records} log records besides job state changes, "
                f"{loose} loose lines, levels {dict(levels)}"
            )
    jobs = Job.objects.filter(unique_key__startswith="outage-bench-")
    states = Counter(jobs.values_list("state", flat=True))
    per_key = Counter(jobs.values_list("unique_key", flat=True))
    twice_units = (
        SideEffect.objects.values("job_id", "key").annotate(n=Count("id")).filter(n__gt=1).count()
    )
    units = SideEffect.objects.filter(job_id__in=jobs.values("pk")).count()
    spent = jobs.filter(attempts__gt=0).count()
    reclaimed = jobs.filter(reclaims__gt=0).count()
    missing = len(set(client.keys) - set(per_key))
    print(
        f"jobs: {len(per_key)} enqueued ({client.failed_enqueues} enqueue calls failed and were "
        f"retried), states {dict(states)}; missing {missing}, a key twice "
        f"{sum(1 for c in per_key.values() if c > 1)}"
    )
    print(
        f"units: {units} rows for {len(per_key) * UNITS} units, {twice_units} twice; "
        f"jobs with an attempt spent: {spent}; jobs reclaimed: {reclaimed}"
    )
    for w in range(len(procs)):
        text = (logs / f"worker-{w}.log").read_text(errors="replace")
        lines = text.splitlines()
        loose = sum(1 for line in lines if not LINE.match(line))
        print(f"worker {w}: alive {alive[w]}; {len(lines)} log lines in all, {loose} not records")


if __name__ == "__main__":
    main()
