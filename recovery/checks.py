"""System checks: what the Problems dashboard needs from a site, said at deploy time.

The embedding is four lines (docs/how-to/embed-in-your-site.md); a site that misses
one gets an error naming what to add, not a 500 on the first page. Pure functions of
the settings (and the template engine), so they are tested without a database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.core import checks

HTMX_MIDDLEWARE = "django_htmx.middleware.HtmxMiddleware"
SESSION_MIDDLEWARE = "django.contrib.sessions.middleware.SessionMiddleware"
AUTH_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"
# The page every other dashboard page extends: found, the engine finds them all.
PROBE_TEMPLATE = "problems/base.html"


def settings_problems(
    settings: Any, *, is_installed: Callable[[str], bool], template_found: Callable[[], bool]
) -> list[checks.CheckMessage]:
    """Pure: the checks' findings for these settings."""
    found: list[checks.CheckMessage] = []
    if not is_installed("durable"):
        found.append(
            checks.Error(
                "recovery runs on the durable engine, which is not in INSTALLED_APPS.",
                hint='Add "durable" to INSTALLED_APPS (before "recovery").',
                id="recovery.E001",
            )
        )
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    if HTMX_MIDDLEWARE not in middleware:
        found.append(
            checks.Error(
                "The Problems dashboard's pages answer htmx requests, but htmx's middleware "
                "is not in MIDDLEWARE.",
                hint=f'Add "{HTMX_MIDDLEWARE}" to MIDDLEWARE (and "django_htmx" to '
                "INSTALLED_APPS).",
                id="recovery.E002",
            )
        )
    for needed in (SESSION_MIDDLEWARE, AUTH_MIDDLEWARE):
        if needed not in middleware:
            found.append(
                checks.Error(
                    "The Problems dashboard is for logged-in staff, but "
                    f"{needed.rsplit('.', 1)[1]} is not in MIDDLEWARE.",
                    hint=f'Add "{needed}" to MIDDLEWARE (django-admin startproject does).',
                    id="recovery.E003",
                )
            )
    if getattr(settings, "BASE_DIR", None) is None:
        found.append(
            checks.Error(
                "The settings have no BASE_DIR: recovery resolves RECOVERY_EVENTS_FILE "
                "against it and keeps imports in BASE_DIR/var/imports.",
                hint="Add BASE_DIR = Path(__file__).resolve().parent.parent (the project "
                "directory) to your settings.",
                id="recovery.E004",
            )
        )
    if not template_found():
        found.append(
            checks.Error(
                f"The dashboard's templates are not found ({PROBE_TEMPLATE}).",
                hint='Set "APP_DIRS": True on the DjangoTemplates engine in TEMPLATES '
                "(or add the app directories loader).",
                id="recovery.E005",
            )
        )
    return found


def _template_found() -> bool:
    from django.template import TemplateDoesNotExist
    from django.template.loader import get_template

    try:
        get_template(PROBE_TEMPLATE)
    except TemplateDoesNotExist:
        return False
    return True


@checks.register()
def check_embedding(app_configs: Iterable[Any] | None = None, **kwargs: Any) -> list[Any]:
    from django.apps import apps
    from django.conf import settings

    return settings_problems(
        settings, is_installed=apps.is_installed, template_found=_template_found
    )
