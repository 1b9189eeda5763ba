"""Enqueue→start latency into idle workers: direct, through PgBouncer, and through it with a bypass.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME python bench/pgbouncer.py [--pings N]

A real PgBouncer (Debian's ``/usr/sbin/pgbouncer``, ``pool_mode = transaction``,
the configuration of docs/how-to/run-workers.md, "Behind PgBouncer") is started
on a free loopback port in front of the database. Three ways to run one idle
worker (``--concurrency 2``, the default ``--poll-interval``) and the client
that enqueues, measured in the same run, in alternating rounds:

- ``direct``: worker and client connect to PostgreSQL; wake-ups by LISTEN/NOTIFY;
- ``pooled``: both through PgBouncer, no ``DURABLE_LISTEN_URL``: the worker finds
  that notifications do not reach it through the pooler and polls;
- ``pooled+bypass``: both through PgBouncer, ``DURABLE_LISTEN_URL`` set to the
  direct URL: the worker LISTENs on a connection of its own that bypasses it.

Each ping is one ``durable.noop`` job enqueued after a random pause (so the
poll timer cannot line up with the pings), timed from the ``enqueue()`` call
(its commit included) to the worker's ``started_at``. Printed: p50/p95/max per
way and the ratio of ``pooled+bypass`` to ``direct``. Target: the bypass
within a few milliseconds of direct, not the poll's hundreds.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recovery.settings")

from _setup import BASE_DIR, configure

MODES = ("direct", "pooled", "pooled+bypass")


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextmanager
def client_through(port: int | None):
    """This process's own connection (the client's enqueues) direct, or via ``port``."""
    from django.db import connection

    saved = dict(connection.settings_dict)
    connection.close()
    if port is not None:
        connection.settings_dict.update(HOST="127.0.0.1", PORT=port)
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)


def _wait_started(job_id: int, timeout: float) -> float:
    from durable.models import Job

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = Job.objects.filter(pk=job_id).values_list("started_at", flat=True).first()
        if started is not None:
            return started.timestamp()
        time.sleep(0.002)
    raise SystemExit(f"job {job_id} did not start within {timeout}s")


def round_of(mode: str, pings: int, direct_url: str, pooled_url: str, port: int, seed: int):
    """One worker started the ``mode`` way, ``pings`` jobs into it: the latencies."""
    from durable.jobs import enqueue

    env = {**os.environ, "LOG_LEVEL": "WARNING", "DATABASE_URL": direct_url}
    env.pop("DURABLE_LISTEN_URL", None)
    if mode != "direct":
        env.update(DATABASE_URL=pooled_url, DISABLE_SERVER_SIDE_CURSORS="true")
    if mode == "pooled+bypass":
        env["DURABLE_LISTEN_URL"] = direct_url
    cmd = [sys.executable, "manage.py", "runworker", "--concurrency", "2"]
    proc = subprocess.Popen(cmd, cwd=BASE_DIR, env=env)
    try:
        with client_through(None if mode == "direct" else port):
            # Warm up: the first job also waits for the start-up, and (pooled) for the
            # listener to find that notifications do not arrive.
            _wait_started(enqueue("durable.noop", {"units": 1}).pk, 60)
            time.sleep(6.0 if mode == "pooled" else 0.5)
            rng, samples = random.Random(seed), []
            for _ in range(pings):
                time.sleep(rng.uniform(0.05, 0.4))
                called = time.time()
                job = enqueue("durable.noop", {"units": 1})
                samples.append(_wait_started(job.pk, 10) - called)
            return samples
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pings", type=int, default=20, help="pings per way per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    url = configure("unused.sqlite3")
    from django.conf import settings
    from django.db import connection

    from durable.models import Job

    if connection.vendor != "postgresql":
        raise SystemExit("PgBouncer pools PostgreSQL: set DATABASE_URL=postgres://…")
    sys.path.insert(0, str(BASE_DIR))
    from tests.pgbouncer import PgBouncer

    bouncer = PgBouncer(target_port=int(connection.settings_dict.get("PORT") or 5432)).start()
    name = connection.settings_dict["NAME"]
    pooled_url = bouncer.url(name, connection.settings_dict.get("USER") or "postgres")
    print(f"database: {url.split('@')[-1]}; PgBouncer on 127.0.0.1:{bouncer.port}")
    print(f"poll interval {settings.DURABLE_POLL_INTERVAL} s; {args.rounds} rounds x {args.pings}")
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        for n in range(args.rounds):
            for mode in MODES if n % 2 == 0 else reversed(MODES):
                results[mode] += round_of(mode, args.pings, url, pooled_url, bouncer.port, n)
                Job.objects.all().delete()
    finally:
        bouncer.close()
    for mode in MODES:
        samples = results[mode]
        print(
            f"{mode:>14}: enqueue->start p50 {_pct(samples, 0.5) * 1000:7.1f} ms, "
            f"p95 {_pct(samples, 0.95) * 1000:7.1f} ms, max {max(samples) * 1000:7.1f} ms, "
            f"mean {statistics.mean(samples) * 1000:7.1f} ms ({len(samples)} pings)"
        )
    ratio = _pct(results["pooled+bypass"], 0.5) / _pct(results["direct"], 0.5)
    gap = (_pct(results["pooled+bypass"], 0.5) - _pct(results["direct"], 0.5)) * 1000
    print(f"pooled+bypass vs direct: p50 ratio {ratio:.2f}, {gap:+.1f} ms")


if __name__ == "__main__":
    main()
