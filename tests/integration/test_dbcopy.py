"""db.copy beyond the shared scenarios: refusals, verification, SQLite -> PostgreSQL.

Jobs run in the test's own transactions (one per database) unless a worker
subprocess or a command thread must see the rows (``transaction=True``).
"""

from __future__ import annotations

import os
import signal

import pytest
from django.core.management import call_command
from django.db import connections

from durable import jobs
from durable.builtin.dbcopy import CopyForm
from durable.errors import InputRejected, LeaseLost
from durable.operations import Unit, get_operation
from tests.conftest import wait_until
from tests.opsapp.models import Sample, Tag

from .dataset import TEST_EXCLUDE, alias_url, contents, make_dataset
from .helpers import drain
from .opscenarios import proc_state, stale_and_fresh

PG = os.environ.get("DATABASE_URL", "").startswith("postgres")
# Long enough that a live worker on this busy 2-core machine never loses its lease
# to a late renewal: a reclaim here would be noise, not the scenario under test.
LEASE = 10.0
pytestmark = pytest.mark.django_db(databases=["default", "other"])


def copy(**data):
    return drain(jobs.enqueue("db.copy", {"exclude": TEST_EXCLUDE, **data}).pk, timeout=60)


def test_copy__refuses_a_target_with_rows_unless_told_to_replace_them():
    make_dataset()
    before = Tag.objects.using("other").count()  # migrate created content types, permissions
    job = copy(target="other")
    assert job.state == "failed"
    assert "already has rows in" in job.reason
    assert "django_content_type" in job.reason
    assert "replace" in job.reason
    assert Tag.objects.using("other").count() == before == 0
    assert not Sample.objects.using("other").exists()


def test_copy__replace_makes_the_target_equal_to_the_source():
    make_dataset()
    Tag.objects.using("other").create(code="only-on-the-target")
    job = copy(target="other", replace=True, batch_size=3)
    assert job.state == "completed", job.reason
    assert contents("other") == contents("default")
    verified = dict(job.unit_results.filter(key__startswith="verif").values_list("key", "result"))
    assert verified["verified:opsapp.sample"]["rows"] == 12
    # Verified in batches of batch_size rows, each a unit of its own.
    assert [verified[f"verify:opsapp.sample:{n}"]["rows"] for n in range(4)] == [3, 3, 3, 3]
    assert "verify:opsapp.sample:4" not in verified
    # The second pass filled in the self-references the first pass left NULL.
    assert job.unit_results.filter(key__startswith="link:opsapp.node:").exists()


def test_copy__a_target_without_the_schema_is_refused_with_the_command_to_run():
    make_dataset()
    with connections["other"].cursor() as cursor:  # rolled back with the test
        cursor.execute("DROP TABLE opsapp_sample_tags")
    job = copy(target="other", replace=True)
    assert job.state == "failed"
    assert "lacks tables opsapp_sample_tags" in job.reason
    assert "migrate --database other" in job.reason


def test_copy__a_worker_that_lost_its_lease_cannot_empty_the_target():
    make_dataset()
    copy(target="other", replace=True)
    copied = contents("other")
    job = jobs.enqueue("db.copy", {"target": "other", "replace": True, "exclude": TEST_EXCLUDE})
    stale, fresh = stale_and_fresh(job)
    copy_op = get_operation("db.copy")
    with pytest.raises(LeaseLost):
        copy_op.run_unit(stale, Unit(key="prepare"))
    assert contents("other") == copied
    assert copy_op.run_unit(fresh, Unit(key="prepare"))["deleted"] > 0


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({}, "target"),
        ({"target": "nowhere"}, "target"),
        ({"target": "default"}, "target"),
        ({"source": "other", "target": "other"}, "target"),
        ({"target": "other", "batch_size": 10**9}, "batch_size"),
        ({"target": "other", "replace": 1}, "replace"),
        ({"target": "other", "into": "x"}, "into"),
    ],
)
def test_input__precise_refusals(data, field):
    with pytest.raises(InputRejected) as refused:
        jobs.enqueue("db.copy", data)
    assert refused.value.field == field


def test_form__cleaned_data_is_the_job_input():
    form = CopyForm(data={"source": "default", "target": "other", "replace": "on", "exclude": ""})
    assert form.is_valid(), form.errors
    job = jobs.enqueue("db.copy", form.cleaned_data)
    assert job.input == {
        "source": "default", "target": "other", "replace": True, "batch_size": 1000, "exclude": [],
    }  # fmt: skip
    assert not CopyForm(data={"source": "default", "target": "nowhere"}).is_valid()


@pytest.mark.skipif(not PG, reason="the SQLite -> PostgreSQL move runs on the PostgreSQL leg")
@pytest.mark.django_db(databases=["default", "other", "lite"])
def test_copy__from_sqlite_to_postgresql():
    assert connections["lite"].vendor == "sqlite"
    assert connections["other"].vendor == "postgresql"
    make_dataset("lite")
    job = copy(source="lite", target="other", replace=True, batch_size=4)
    assert job.state == "completed", job.reason
    assert contents("other") == contents("lite")
    # The sequences moved past the copied ids: the next insert does not collide.
    highest = Sample.objects.using("lite").order_by("-pk")[0].pk
    assert Sample.objects.using("other").create(name="first on PostgreSQL").pk > highest


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_verify__a_write_to_the_target_during_the_copy_fails_the_job(workers):
    # transaction=True: a worker subprocess copies the test's rows.
    make_dataset()
    job = jobs.enqueue("db.copy", {"target": "other", "replace": True, "exclude": TEST_EXCLUDE})
    env = {"TEST_OTHER_DATABASE_URL": alias_url("other")}
    proc = workers.start("--burst", faults="dbcopy.before_verify:1:stop", lease=LEASE, env=env)
    wait_until(lambda: proc_state(proc.pid) == "T")  # stopped before verifying
    Sample.objects.using("other").filter(name__startswith="sample 3 ").update(count=999)
    os.kill(proc.pid, signal.SIGCONT)
    assert proc.wait(timeout=60) == 0, workers.log(proc)
    job.refresh_from_db()
    assert job.state == "failed"
    assert "opsapp.sample differs after the copy (rows after" in job.reason
    assert "stop the site's writers" in job.reason


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("extra", "the source has 12 and the target 13 now"),  # a row only on the target
        ("missing", "target 2 rows"),  # a row the target lost: its batch differs
        # The source wrote into a range already verified: only the close sees it.
        ("grown", "the source has 13 and the target 12 now"),
    ],
)
def test_verify__every_difference_is_found_batch_by_batch(change, expected):
    make_dataset()
    job = jobs.enqueue(
        "db.copy", {"target": "other", "replace": True, "batch_size": 3, "exclude": TEST_EXCLUDE}
    )
    original = get_operation("db.copy")._verify_batch

    def after_the_copy(spec, source, target, payload):
        if spec.label == "opsapp.sample" and payload["after"] is None:  # the table's first batch
            if change == "extra":
                Sample.objects.using("other").create(name="written on the target")
            elif change == "missing":
                Sample.objects.using("other").filter(pk=payload["upto"]).delete()
        behind = change == "grown" and payload["after"] is not None  # a range already verified
        if spec.label == "opsapp.sample" and behind and not Sample.objects.filter(pk=0).exists():
            Sample.objects.create(name="written on the source meanwhile", id=0)
        return original(spec, source, target, payload)

    operation = get_operation("db.copy")
    operation._verify_batch = after_the_copy
    try:
        job = drain(job.pk, timeout=60)
    finally:
        del operation._verify_batch
    assert job.state == "failed"
    assert "opsapp.sample differs after the copy" in job.reason
    assert expected in job.reason


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_command__copy_database_inline(capsys):
    # transaction=True: --inline runs the job in a thread with its own connection.
    make_dataset(samples=3)
    call_command(
        "copy_database", "--target", "other", "--replace", "--inline",
        *[arg for label in TEST_EXCLUDE for arg in ("--exclude", label)],
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "row counts and checksums match" in out
    assert contents("other") == contents("default")
