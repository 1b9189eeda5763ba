"""A database outage under real workers, scaled down from bench/outage.py: calm, quick, exact.

Two worker processes connect to PostgreSQL through a TCP relay on loopback the
test controls (``tests.relay``); jobs are enqueued before and during the
outages. The relay cuts every connection and refuses new ones twice: briefly,
then for longer than the lease. Then: every job completes, each unit's row
exactly once, no attempt spent, nothing taken back as if its worker had died;
work resumes within 2 s of each return; and each worker said one warning and
one line on the return per outage, each record on one line, no traceback.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from django.db import connection

from durable import jobs
from durable.models import Job, JobEvent
from tests.conftest import database_url, wait_until
from tests.relay import Relay
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LEASE = 2.0
UNITS = 3


@pytest.fixture
def relay():
    if connection.vendor != "postgresql":
        pytest.skip("the relay cuts TCP connections: PostgreSQL")
    cut = Relay(int(connection.settings_dict.get("PORT") or 5432))
    yield cut
    cut.close()


def _enqueue(n: int) -> list[int]:
    return [
        jobs.enqueue("test.rows", {"units": UNITS, "sleep": 0.1}, max_attempts=10).pk
        for _ in range(n)
    ]


def _first_unit_after(moment: float) -> float:
    after = datetime.fromtimestamp(moment, tz=UTC)
    first = wait_until(
        lambda: SideEffect.objects.filter(created_at__gt=after).order_by("created_at").first(),
        timeout=30,
    )
    return first.created_at.timestamp() - moment


def _notable(logs: list[str]) -> list[str]:
    """The lines of the workers' logs that explain a reclaim, for a failure's message."""
    words = ("database", "reclaimed", "released", "handing back", "lease lost", "failed")
    return [
        line[:220] for log in logs for line in log.splitlines() if any(w in line for w in words)
    ]


def _outage(relay: Relay, seconds: float, during: int) -> tuple[list[int], float]:
    """Cut for ``seconds``, enqueueing ``during`` jobs meanwhile; the resume delay."""
    assert relay.cut() > 0  # the workers' connections, cut mid-stream
    enqueued = _enqueue(during)
    time.sleep(seconds)
    relay.restore()
    return enqueued, _first_unit_after(time.time())


def test_outage__workers_stay_calm_resume_within_two_seconds_and_keep_every_guarantee(
    workers, relay
):
    url = database_url(direct=True).replace(f":{relay.target[1]}/", f":{relay.port}/")
    procs = [
        workers.start("--concurrency", "2", lease=LEASE, env={"DATABASE_URL": url})
        for _ in range(2)
    ]
    created = _enqueue(6)
    # Both started (each is to see both outages) and busy when the cut comes.
    wait_until(lambda: all("worker started" in workers.log(p) for p in procs), timeout=60)
    wait_until(lambda: SideEffect.objects.exists(), timeout=30)
    moments = [("first cut", time.time())]
    more, short_resume = _outage(relay, 1.5, during=2)
    moments.append(("first return", time.time() - short_resume))
    created += more
    created += _enqueue(4)
    wait_until(lambda: SideEffect.objects.count() >= 12, timeout=30)
    # Two outages, not one with a gap no worker noticed: each saw the database back.
    wait_until(lambda: all("database reachable again" in workers.log(p) for p in procs), timeout=30)
    moments.append(("second cut", time.time()))
    more, long_resume = _outage(relay, 3 * LEASE, during=2)  # longer than the lease
    created += more
    done = wait_until(
        lambda: not Job.objects.filter(pk__in=created).exclude(state="completed").exists(),
        timeout=60,
    )
    assert done
    logs = [workers.log(proc) for proc in procs]
    assert all(proc.poll() is None for proc in procs), logs
    assert (short_resume < 2.0, long_resume < 2.0) == (True, True), (short_resume, long_resume)
    # exactly once, nothing spent, nothing taken back as from a dead worker
    rows = list(SideEffect.objects.filter(job_id__in=created).values_list("job_id", "key"))
    assert sorted(rows) == sorted((pk, f"u{n}") for pk in created for n in range(UNITS))
    spent = list(Job.objects.filter(pk__in=created, attempts__gt=0).values_list("pk", flat=True))
    reclaimed = list(
        JobEvent.objects.filter(job_id__in=created, kind="reclaimed").values_list(
            "job_id", flat=True
        )
    )
    history = [
        (e.job_id, e.seq, e.kind, e.message[:80], e.created_at.isoformat()[11:23])
        for e in JobEvent.objects.filter(job_id__in={*spent, *reclaimed}).order_by("job_id", "seq")
    ]
    assert (spent, reclaimed) == ([], []), "\n".join(
        map(str, [*history, *_notable(logs), *moments])
    )
    for log in logs:
        lines = log.splitlines()
        assert all(line.startswith("time=") for line in lines), log  # one record per line
        assert "traceback=" not in log, log
        assert log.count('msg="database unreachable"') == 2, log  # once per outage
        assert log.count('msg="database reachable again"') == 2, log
