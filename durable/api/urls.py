"""Mount with ``path("api/", include("durable.api.urls"))``."""

from django.urls import path, re_path

from . import schedule_views, views

app_name = "durable-api"

urlpatterns = [
    path("jobs", views.jobs_view, name="jobs"),
    path("jobs/batch", views.jobs_batch_view, name="jobs-batch"),
    path("jobs/<int:job_id>", views.job_view, name="job"),
    path("jobs/<int:job_id>/events", views.job_events_view, name="job-events"),
    path("jobs/<int:job_id>/result", views.job_result_view, name="job-result"),
    path("jobs/<int:job_id>/<str:action>", views.job_action_view, name="job-action"),
    path("schedules", schedule_views.schedules_view, name="schedules"),
    path("schedules/<int:schedule_id>", schedule_views.schedule_view, name="schedule"),
    path("openapi.json", views.openapi_view, name="openapi"),
    # Anything else under the prefix: a JSON 404, not the site's HTML page. [\s\S], not
    # ".": a path with a (percent-encoded) line break must match too.
    re_path(r"^(?P<rest>[\s\S]*)\Z", views.not_found_view, name="not-found"),
]
