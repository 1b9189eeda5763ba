"""The engine through PgBouncer in transaction pooling mode, with real worker processes.

The core of the engine, crash and fencing tests, run again here with every
worker connecting through a real PgBouncer (``tests.pgbouncer``: Debian's 1.18,
``pool_mode = transaction``, the configuration of "Behind PgBouncer"): jobs
complete, atomic units commit once across a SIGKILL, a stalled worker's commit is
fenced off, two workers never run one job, SIGTERM hands a job back unspent, and
an idle worker is woken through the ``DURABLE_LISTEN_URL`` bypass. Then what is
particular to a pooler: wake-ups without the bypass fall back to polling, and
say so once. The whole suite runs through it with ``TEST_PGBOUNCER=1``.
"""

from __future__ import annotations

import time

import pytest

from durable import jobs
from durable.models import Job
from tests.conftest import wait_until
from tests.integration.test_crash import (  # noqa: F401 - collected again, through the pooler
    test_concurrent_workers__never_run_one_job_in_two_places,
    test_crash_before_checkpoint__atomic_units_are_exactly_once,
    test_renewal__a_unit_longer_than_the_lease_keeps_its_job,
    test_sigterm__stops_at_a_unit_boundary_and_returns_the_job_unspent,
    test_stale_worker__cannot_advance_the_checkpoint_after_its_lease_expired,
    test_worker__runs_jobs_to_completion,
    test_worker_deaths_after_progress__spend_no_attempt_and_the_job_completes,
)
from tests.integration.test_recovery_workers import (  # noqa: F401 - the ingest's COPY
    test_worker_killed_mid_ingest__replay_never_duplicates,
)
from tests.integration.test_small_jobs import (  # noqa: F401
    test_wakeup__a_job_enqueued_into_an_idle_worker_starts_long_before_its_poll,
)
from tests.pgbouncer import routed
from tests.testapp.models import SideEffect

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("through_pgbouncer"),
]


def test_pgbouncer__the_workers_really_connect_through_it(workers, through_pgbouncer):
    before = through_pgbouncer.log().count("login attempt")
    job = jobs.enqueue("test.rows", {"units": 3})
    workers.run()
    assert Job.objects.get(pk=job.pk).state == "completed"
    assert SideEffect.objects.filter(job_id=job.pk).count() == 3
    assert through_pgbouncer.log().count("login attempt") > before


def test_wakeups__without_a_bypass_idle_workers_poll_and_say_so_once(workers, through_pgbouncer):
    with routed(through_pgbouncer, listen_url=""):  # LISTEN through the pooler: it cannot keep it
        proc = workers.start("--poll-interval", "0.5")
    log = wait_until(
        lambda: "wake-ups do not arrive" in workers.log(proc) and workers.log(proc), timeout=30
    )
    waits = []
    for _ in range(3):
        job = jobs.enqueue("durable.noop", {"units": 1})
        wait_until(lambda j=job: Job.objects.get(pk=j.pk).state == "completed", timeout=10)
        job.refresh_from_db()
        waits.append((job.started_at - job.created_at).total_seconds())
        time.sleep(0.2)
    assert max(waits) < 1.5, waits  # the poll's timer, not a lost wake-up
    log = workers.log(proc)
    assert log.count("wake-ups do not arrive") == 1
    assert "Traceback" not in log
    assert proc.poll() is None
