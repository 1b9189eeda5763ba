from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView


class FaviconView(RedirectView):
    """Browsers ask for /favicon.ico on pages without an icon link (the admin's)."""

    permanent = False

    def get_redirect_url(self, *args: object, **kwargs: object) -> str:
        return static("problems/favicon.svg")


urlpatterns = [
    path("", RedirectView.as_view(pattern_name="problems:summary", permanent=False)),
    path("favicon.ico", FaviconView.as_view()),
    path("problems/", include("recovery.dashboard.urls")),
    path("admin/", admin.site.urls),
    path("api/", include("durable.api.urls")),
    path("metrics", include("durable.metrics.urls")),
]
