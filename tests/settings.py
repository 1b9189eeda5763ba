"""The site's settings plus a test-only app whose operations have countable side effects.

Worker subprocesses started by the tests use these settings too, so they know
the same operations.
"""

import os

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

# The encrypted credential table needs a key; worker subprocesses read this file too.
# A fixed, test-only key (never used outside the test suite).
DURABLE_CREDENTIAL_KEY = os.environ.get(
    "DURABLE_CREDENTIAL_KEY", "q8m0Z2dKkqgYcEw3oKc9x5i9tqk5Xo3h1H2PvwKpS8s="
)
