"""The Problems dashboard knows Django tasks: path, queue, priority, arguments, result, errors."""

from __future__ import annotations

import pytest
from django.urls import reverse

from durable.tasks.policy import TASK_OPERATION
from tests.integration.test_tasks import run_tasks
from tests.testapp import tasks

from .test_new_job import URL as NEW_JOB_URL
from .test_new_job import listed

pytestmark = pytest.mark.django_db


def test_jobs_list__shows_the_task_function_queue_and_priority(client_for):
    tasks.echo.using(priority=7).enqueue("hello")
    html = client_for("readonly").get(reverse("problems:jobs")).content.decode()
    assert "tests.testapp.tasks.echo" in html
    assert "queue emails" in html
    assert "priority 7" in html


def test_job_detail__a_successful_task_shows_its_arguments_and_return_value(client_for):
    result = tasks.echo.enqueue("<b>hi</b>", flag=True)
    run_tasks()
    page = client_for("readonly").get(reverse("problems:job", args=[int(result.id)]))
    html = page.content.decode()
    assert "Django task" in html
    assert "tests.testapp.tasks.echo" in html
    assert "SUCCESSFUL" in html
    assert "&lt;b&gt;hi&lt;/b&gt;" in html  # escaped like any input
    assert "<b>hi</b>" not in html
    return_block = html.split('class="json task-return">', 1)[1].split("</pre>", 1)[0]
    assert "&quot;nested&quot;" in return_block
    assert "&quot;flag&quot;: true" in html


def test_job_detail__a_failed_task_shows_its_error_class_and_no_return_value(client_for):
    result = tasks.refuse.enqueue()
    run_tasks()
    html = client_for("readonly").get(reverse("problems:job", args=[int(result.id)])).content
    html = html.decode()
    assert "FAILED" in html
    assert "None: the task failed" in html
    assert "builtins.PermissionError" in html
    assert "not yours" in html  # the error history below


def test_job_detail__steps_show_n_of_total(client_for, tmp_path):
    result = tasks.stepped.enqueue(str(tmp_path / "out.txt"), steps=3)
    run_tasks()
    html = client_for("readonly").get(reverse("problems:job", args=[int(result.id)])).content
    assert "3 of 3 done" in html.decode()


def test_new_job__never_offers_tasks_whose_arguments_it_cannot_build(client_for):
    admin = client_for("admin")
    assert TASK_OPERATION not in listed(admin)
    response = admin.post(NEW_JOB_URL, {"operation": TASK_OPERATION, "input": "{}"})
    assert response.status_code == 403
