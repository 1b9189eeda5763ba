"""The guarantees for every built-in database operation: one scenario each, the same trials.

The guarantees: docs/explanation/guarantees.md.

Positive completion; a crash before the checkpoint; a crash right after a
unit's side effect (a real worker SIGKILLed at an engine or operation fault
point); a stalled worker whose lease expires and is reclaimed; several
workers at once; pause; cancel. Each scenario's ``check`` proves the output
is right and that nothing was done twice (events, rows, files).

``transaction=True`` everywhere: the workers are other processes, so the
test's rows must really be committed, and they write to the second
databases too.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from django.utils import timezone

from durable import jobs
from durable.models import Job
from tests.conftest import wait_until

from .helpers import drain
from .opscenarios import SCENARIOS, Env, Scenario, proc_state

# Long enough that a live worker on this busy 2-core machine never loses its lease
# to a late renewal: a reclaim here would be noise, not the scenario under test.
LEASE = 10.0
pytestmark = pytest.mark.slow


def _param(scenario: Scenario, *values, id: str) -> pytest.param:
    # Each scenario sets up (and flushes afterwards) only the databases it uses.
    marks = pytest.mark.django_db(transaction=True, databases=scenario.databases)
    return pytest.param(scenario, *values, marks=marks, id=id)


@pytest.fixture
def env(tmp_path: Path, settings) -> Env:
    env = Env(tmp=tmp_path, backups=tmp_path / "backups", scan_root=tmp_path / "scan")
    env.backups.mkdir()
    env.scan_root.mkdir()
    settings.DURABLE_BACKUP_DIR = env.backups
    settings.STORAGES = {
        **settings.STORAGES,
        "scan": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(env.scan_root)},
        },
    }
    return env


@pytest.fixture(params=[_param(s, id=repr(s)) for s in SCENARIOS])
def scenario(request) -> Scenario:
    return request.param


CRASHES = [_param(s, point, id=f"{s!r}-{point}") for s in SCENARIOS for point in s.crash_points]


def kinds(job: Job) -> list[str]:
    return list(job.events.order_by("seq").values_list("kind", flat=True))


def test_completes(scenario, env):
    case = scenario.cases(env)[0]
    job = drain(jobs.enqueue(scenario.operation, case.input).pk, timeout=120)
    case.check(job)
    assert job.units_done == job.units_total  # the progress bar ends full
    assert job.attempts == 0


def test_crash_before_checkpoint__repeats_nothing_that_was_checkpointed(scenario, env, workers):
    case = scenario.cases(env)[0]
    job = jobs.enqueue(scenario.operation, case.input)
    crashed = workers.run(faults="before_unit:3", lease=LEASE, env=env.worker_env())
    assert crashed.returncode == -signal.SIGKILL, workers.log(crashed)
    job.refresh_from_db()
    assert (job.state, job.units_done) == ("running", 2)
    first_two = set(job.unit_results.values_list("key", "created_at"))

    resumed = workers.run(lease=LEASE, env=env.worker_env())
    assert resumed.returncode == 0, workers.log(resumed)
    job.refresh_from_db()
    case.check(job)
    assert job.reclaims == 1
    # The two checkpointed units were not run again: their evidence is the original.
    assert first_two <= set(job.unit_results.values_list("key", "created_at"))


@pytest.mark.parametrize(("scenario", "point"), CRASHES)
def test_crash_after_side_effect__the_replay_does_not_duplicate_it(scenario, point, env, workers):
    case = scenario.cases(env)[0]
    job = jobs.enqueue(scenario.operation, case.input)
    crashed = workers.run(faults=point, lease=LEASE, env=env.worker_env())
    assert crashed.returncode == -signal.SIGKILL, workers.log(crashed)
    job.refresh_from_db()
    assert job.state == "running"

    resumed = workers.run(lease=LEASE, env=env.worker_env())
    assert resumed.returncode == 0, workers.log(resumed)
    job.refresh_from_db()
    case.check(job)  # includes: every event once, every row once
    assert job.reclaims == 1


def test_expired_lease__another_worker_takes_over_and_the_stale_one_changes_nothing(
    scenario, env, workers
):
    case = scenario.cases(env)[0]
    job = jobs.enqueue(scenario.operation, case.input)
    stale = workers.start(
        "--burst", "--max-jobs", "1", faults="after_unit:2:stop", lease=1.0, env=env.worker_env()
    )
    wait_until(lambda: proc_state(stale.pid) == "T")  # stopped after unit 2's side effect
    job.refresh_from_db()
    assert job.units_done == 1
    wait_until(lambda: Job.objects.get(pk=job.pk).lease_expires_at < timezone.now(), timeout=10)

    rescuer = workers.run(lease=LEASE, env=env.worker_env())
    assert rescuer.returncode == 0, workers.log(rescuer)
    job.refresh_from_db()
    case.check(job)
    finished = (job.state, job.checkpoint, job.units_done, job.event_seq)

    os.kill(stale.pid, signal.SIGCONT)
    assert stale.wait(timeout=30) == 0
    assert "lease lost" in workers.log(stale)
    job.refresh_from_db()
    assert (job.state, job.checkpoint, job.units_done, job.event_seq) == finished
    case.check(job)  # the stale worker's late unit did not spoil the result


def test_concurrent_workers__each_job_runs_in_one_place_at_a_time(scenario, env, workers):
    cases = scenario.cases(env, count=2)
    created = [jobs.enqueue(scenario.operation, case.input) for case in cases]
    procs = [workers.start("--burst", lease=LEASE, env=env.worker_env()) for _ in range(2)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, workers.log(proc)
    for case, job in zip(cases, created, strict=True):
        job.refresh_from_db()
        case.check(job)
        # One claim, never taken back: no second worker ever ran a unit of it.
        assert kinds(job).count("started") == 1
        assert job.reclaims == 0


def _stopped_mid_job(scenario, env, workers, action):
    case = scenario.cases(env)[0]
    job = jobs.enqueue(scenario.operation, case.input)
    proc = workers.start(
        "--burst", faults="after_checkpoint:2:stop", lease=LEASE, env=env.worker_env()
    )
    wait_until(lambda: proc_state(proc.pid) == "T")  # two units checkpointed
    assert getattr(jobs, action)(job.pk, actor="ops").applied
    os.kill(proc.pid, signal.SIGCONT)
    assert proc.wait(timeout=60) == 0, workers.log(proc)
    job.refresh_from_db()
    return case, job


def test_pause__stops_at_a_unit_boundary_and_resumes_from_the_checkpoint(scenario, env, workers):
    case, job = _stopped_mid_job(scenario, env, workers, "pause")
    assert (job.state, job.lease_owner) == ("paused", None)
    assert 2 <= job.units_done < job.units_total
    assert jobs.resume(job.pk, actor="ops").applied
    assert workers.run(lease=LEASE, env=env.worker_env()).returncode == 0
    job.refresh_from_db()
    case.check(job)
    assert kinds(job).count("resumed") == 1


def test_cancel__stops_at_a_unit_boundary_and_never_completes(scenario, env, workers):
    case, job = _stopped_mid_job(scenario, env, workers, "cancel")
    assert job.state == "cancelled"
    assert job.units_done < job.units_total
    assert "completed" not in kinds(job)
    case.check_cancelled(job)
