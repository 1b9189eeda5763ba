"""The site's settings plus a test-only app whose operations have countable side effects.

Worker subprocesses started by the tests use these settings too, so they know
the same operations.
"""

from recovery.settings import *  # noqa: F403
from recovery.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]
# Hashing passwords properly is slow on purpose; tests create many users.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Tests render templates without running collectstatic first.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# Serve static files straight from static/ (make test never runs collectstatic);
# autorefresh also keeps WhiteNoise from warning that var/staticfiles is missing.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True
