"""``/problems/…``: mounted by the site's ``recovery/urls.py``."""

from django.urls import path, register_converter

from . import console, job_actions, job_bulk, jobs, new_job, record, schedules, views


class JobId:
    """1 to 18 digits: a larger number cannot be a job id (and would overflow a BIGINT)."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(JobId, "job")

app_name = "problems"

urlpatterns = [
    path("", views.summary, name="summary"),
    path("recovery/", views.recovery, name="recovery"),
    path("recovery/record/", record.record, name="record-event"),
    path("security/", views.security, name="security"),
    path("jobs/", jobs.job_list, name="jobs"),
    path("jobs/new/", new_job.new_job, name="new-job"),
    path("jobs/bulk/", job_bulk.bulk, name="bulk"),
    path("jobs/<job:job_id>/", jobs.job_detail, name="job"),
    path("jobs/<job:job_id>/<slug:action>/", job_actions.job_action, name="job-action"),
    path("queues/", console.queues, name="queues"),
    path("queues/<slug:change>/", console.queue_change, name="queue-change"),
    path("workers/", console.workers, name="workers"),
    path("schedules/", schedules.schedule_list, name="schedules"),
    path("schedules/new/", schedules.new_schedule, name="new-schedule"),
    path(
        "schedules/<job:schedule_id>/<slug:change>/",
        schedules.schedule_change,
        name="schedule-change",
    ),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
]
