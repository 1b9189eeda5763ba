"""The site's settings plus a test-only app whose operations have countable side effects.

Worker subprocesses started by the tests use these settings too, so they know
the same operations.
"""

import os

import dj_database_url

from recovery.settings import *  # noqa: F403
from recovery.settings import DATABASES, INSTALLED_APPS, STORAGES, VAR_DIR

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp", "tests.opsapp"]
# Hashing passwords properly is slow on purpose; tests create many users.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Tests render templates without running collectstatic first.
# (FILE_STORAGES aliases, which worker subprocesses get from the environment, stay.)
STORAGES = {
    **STORAGES,
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    # integrity.scan tests: each test points it at its own directory (TEST_SCAN_ROOT
    # for worker subprocesses).
    "scan": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": os.environ.get("TEST_SCAN_ROOT", str(VAR_DIR / "test-scan"))},
    },
}

# The encrypted credential table needs a key; worker subprocesses read this file too.
# A fixed, test-only key (never used outside the test suite).
DURABLE_CREDENTIAL_KEY = os.environ.get(
    "DURABLE_CREDENTIAL_KEY", "q8m0Z2dKkqgYcEw3oKc9x5i9tqk5Xo3h1H2PvwKpS8s="
)

# --- Second databases for db.copy, restore and integrity tests ------------------------
# "other": the same vendor as "default" (a second SQLite file, or a second PostgreSQL
# database). "lite": always SQLite (on the PostgreSQL leg: the SQLite -> PostgreSQL
# copy). pytest-django creates their test databases for tests that ask for them
# (databases=[...]); worker subprocesses get those test databases' URLs through
# TEST_<ALIAS>_DATABASE_URL.
_SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 30.0,
    "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL",
}


def _sqlite(name: str) -> dict:
    return {
        **dj_database_url.parse(f"sqlite:///{VAR_DIR / f'{name}.sqlite3'}"),
        "OPTIONS": dict(_SQLITE_OPTIONS),
        "TEST": {"NAME": str(VAR_DIR / f"test-{name}.sqlite3")},
    }


def _second(alias: str, config: dict) -> dict:
    url = os.environ.get(f"TEST_{alias.upper()}_DATABASE_URL")
    if not url:
        return config
    parsed = dj_database_url.parse(url)
    if parsed["ENGINE"] == "django.db.backends.sqlite3":
        parsed["OPTIONS"] = dict(_SQLITE_OPTIONS)
    return {**config, **parsed, "TEST": config.get("TEST", {})}


_default = DATABASES["default"]
if _default["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["other"] = _second("other", _sqlite("other"))
else:
    DATABASES["other"] = _second(
        "other",
        {
            **_default,
            "NAME": f"{_default['NAME']}_other",
            "TEST": {"NAME": f"{_default['TEST']['NAME']}_other"},
        },
    )
# Its own file on each leg, so the two legs can run side by side in one checkout.
DATABASES["lite"] = _second(
    "lite", _sqlite("lite" if _default["ENGINE"] == "django.db.backends.sqlite3" else "lite-pg")
)
# A daily purge firing during a test run would add a job to tests that count them;
# the retention schedule's own tests switch it on.
DURABLE_RETENTION = "off"


# Serve static files straight from static/ (make test never runs collectstatic);
# autorefresh also keeps WhiteNoise from warning that var/staticfiles is missing.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True

# Django tasks on the engine, with the queues and a second alias the task tests use.
TASKS = {
    "default": {
        "BACKEND": "durable.tasks.DurableBackend",
        "QUEUES": ["default", "emails", "low"],
        "OPTIONS": {"MAX_ATTEMPTS": 3, "BACKOFF_BASE": 0},
    },
    "patient": {
        "BACKEND": "durable.tasks.DurableBackend",
        "QUEUES": [],
        "OPTIONS": {
            "MAX_ATTEMPTS": 1,
            "ON_RESTART": "retry",
            "NON_RETRYABLE": ["builtins.LookupError"],
        },
    },
}

# Worker subprocesses of the tracing tests record their spans to this file.
if os.environ.get("TEST_TRACE_FILE"):
    from tests import traces

    traces.record_to_file(os.environ["TEST_TRACE_FILE"])
