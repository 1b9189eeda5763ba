"""The site's settings plus a test-only app whose operations have countable side effects.

Worker subprocesses started by the tests use these settings too, so they know
the same operations.
"""

from recovery.settings import *  # noqa: F403
from recovery.settings import INSTALLED_APPS, STORAGES

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]
# Hashing passwords properly is slow on purpose; tests create many users.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Tests render templates without running collectstatic first.
# (FILE_STORAGES aliases, which worker subprocesses get from the environment, stay.)
STORAGES = {
    **STORAGES,
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# A daily purge firing during a test run would add a job to tests that count them;
# the retention schedule's own tests switch it on.
DURABLE_RETENTION = "off"
