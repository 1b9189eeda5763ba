"""Mount with ``path("metrics", include("durable.metrics.urls"))``."""

from django.urls import path

from . import views

app_name = "durable-metrics"

urlpatterns = [path("", views.metrics_view, name="metrics")]
