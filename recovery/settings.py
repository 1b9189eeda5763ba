"""Site settings, read from the environment so one build runs anywhere.

Every variable is listed in docs/reference/settings.md (a test fails when one is
missing). Defaults aim at a single machine with the embedded SQLite database;
PostgreSQL is selected with DATABASE_URL.
"""

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

import dj_database_url
import django
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use 1/0, true/false)")


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def _secret_key() -> str:
    """A stable key without configuration: generated once into var/ (mode 0600).

    A fixed default would let anyone forge sessions on a site that forgot to set
    SECRET_KEY; a fresh random key per start would log everybody out on restart.
    """
    if key := os.environ.get("SECRET_KEY"):
        return key
    path = VAR_DIR / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(50)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(key)
        return key
    except OSError as exc:  # pragma: no cover - read-only deployments must set SECRET_KEY
        raise ImproperlyConfigured(f"SECRET_KEY is not set and {path} is unusable: {exc}") from exc


SECRET_KEY = _secret_key()
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    # Django's Tasks framework: the django-tasks backport on Django 5.2 (its signals'
    # logging and system checks); Django 6 has it built in, as django.tasks.
    *(["django_tasks"] if django.VERSION < (6,) else []),
    "durable",
    "recovery",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # 503 + Retry-After, not 500, for a page asked for while the database is unreachable.
    "recovery.dashboard.unavailable.DatabaseUnavailableMiddleware",
]

ROOT_URLCONF = "recovery.urls"
WSGI_APPLICATION = "recovery.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database ---------------------------------------------------------------

DATABASE_URL = os.environ.get("DATABASE_URL", "sqlite:///var/db.sqlite3")
_db = dj_database_url.parse(DATABASE_URL)

if _db["ENGINE"] == "django.db.backends.sqlite3":
    _name = Path(_db["NAME"])
    if not _name.is_absolute():
        _name = BASE_DIR / _name
    _name.parent.mkdir(parents=True, exist_ok=True)
    _db["NAME"] = str(_name)
    _synchronous = os.environ.get("SQLITE_SYNCHRONOUS", "NORMAL").upper()
    if _synchronous not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
        raise ImproperlyConfigured(f"SQLITE_SYNCHRONOUS={_synchronous!r}: use NORMAL or FULL")
    _db["OPTIONS"] = {
        # BEGIN IMMEDIATE takes the write lock up front, so two workers never
        # both read a row and then fail to upgrade to a write ("database is
        # locked"); the busy timeout makes the loser wait instead of failing.
        "transaction_mode": "IMMEDIATE",
        "timeout": float(os.environ.get("SQLITE_BUSY_TIMEOUT", "30")),
        "init_command": (
            "PRAGMA journal_mode=WAL;"
            f"PRAGMA synchronous={_synchronous};"
            "PRAGMA cache_size=-20000;"
            "PRAGMA temp_store=MEMORY"
        ),
    }
    # Worker subprocesses in tests must see the test database, so it is a file.
    _db["TEST"] = {"NAME": str(VAR_DIR / "test-db.sqlite3")}
else:
    # Assigned, not setdefault: dj_database_url.parse() already put CONN_MAX_AGE=0 there.
    _db["CONN_MAX_AGE"] = int(os.environ.get("CONN_MAX_AGE", "60"))
    _db["CONN_HEALTH_CHECKS"] = True
    # A process stalled inside a transaction (SIGSTOP, a debugger, a hung unit)
    # would hold its row locks forever; the server ends such a session instead.
    _idle_ms = int(float(os.environ.get("PG_IDLE_IN_TRANSACTION_TIMEOUT", "300")) * 1000)
    _db.setdefault("OPTIONS", {})["options"] = f"-c idle_in_transaction_session_timeout={_idle_ms}"
    # Behind a pooler in transaction mode (PgBouncer): .iterator()'s server-side cursors
    # cannot outlive their statement there (docs: run-workers.md, "Behind PgBouncer").
    _db["DISABLE_SERVER_SIDE_CURSORS"] = env_bool("DISABLE_SERVER_SIDE_CURSORS", False)
    # Several checkouts of this project may share one PostgreSQL server; each
    # gets its own test database so their test runs never collide.
    _suffix = hashlib.sha256(str(BASE_DIR).encode()).hexdigest()[:8]
    _db["TEST"] = {"NAME": os.environ.get("TEST_DATABASE_NAME", f"test_{_db['NAME']}_{_suffix}")}

DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Auth, i18n, static -----------------------------------------------------

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "problems:login"  # the dashboard's own page; the admin keeps /admin/login/
RECOVERY_LOGIN_URL = LOGIN_URL  # where the dashboard sends visitors who are not logged in

LANGUAGE_CODE = "en-us"
TIME_ZONE = os.environ.get("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# --- Security headers ---------------------------------------------------------

X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "0"))
if os.environ.get("SECURE_PROXY_SSL_HEADER"):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- The durable engine -----------------------------------------------------

DURABLE_LEASE_SECONDS = float(os.environ.get("DURABLE_LEASE_SECONDS", "30"))
DURABLE_POLL_INTERVAL = float(os.environ.get("DURABLE_POLL_INTERVAL", "1"))
DURABLE_GRACE_SECONDS = float(os.environ.get("DURABLE_GRACE_SECONDS", "25"))
# SQLite: how often an idle worker reads PRAGMA data_version to notice a newly
# due job (a shared-memory read; PostgreSQL workers are woken by NOTIFY instead).
DURABLE_SQLITE_WAKE_INTERVAL = float(os.environ.get("DURABLE_SQLITE_WAKE_INTERVAL", "0.01"))
# PostgreSQL behind PgBouncer in transaction mode: a URL that reaches PostgreSQL
# directly, for the workers' LISTEN (wake-ups); empty: the DATABASE_URL connection.
DURABLE_LISTEN_URL = os.environ.get("DURABLE_LISTEN_URL", "")
DURABLE_MAX_INPUT_BYTES = int(os.environ.get("DURABLE_MAX_INPUT_BYTES", str(64 * 1024)))
# Seconds of work each unit of a batching operation (ingest, imports, copies) aims at.
DURABLE_UNIT_TARGET_SECONDS = float(os.environ.get("DURABLE_UNIT_TARGET_SECONDS", "0.4"))
# Spans of jobs, units and outbound HTTP calls when an OpenTelemetry SDK is configured.
DURABLE_TRACING = env_bool("DURABLE_TRACING", True)

# Django's Tasks framework runs on the engine: every task.enqueue() is a durable job
# (docs/how-to/write-a-django-task.md, "Django tasks"). TASKS_QUEUES: comma-separated
# queue names tasks may use.
TASKS = {
    "default": {
        "BACKEND": "durable.tasks.DurableBackend",
        "QUEUES": env_list("TASKS_QUEUES", "default"),
        "OPTIONS": {"MAX_ATTEMPTS": int(os.environ.get("TASKS_MAX_ATTEMPTS", "3"))},
    }
}

# --- The job API (durable.api, mounted at /api/) ------------------------------

# Largest POST body accepted; larger ones get 413 before they are read.
DURABLE_API_MAX_BODY_BYTES = int(os.environ.get("DURABLE_API_MAX_BODY_BYTES", str(256 * 1024)))
# One SSE stream holds a gunicorn thread this long at most; the client then reconnects.
DURABLE_API_STREAM_SECONDS = float(os.environ.get("DURABLE_API_STREAM_SECONDS", "25"))
# Event streams one web process serves at once; more get 503 + Retry-After. Keep it
# below gunicorn's threads per process (WEB_THREADS, 8) so pages always find a thread.
DURABLE_API_MAX_STREAMS = int(os.environ.get("DURABLE_API_MAX_STREAMS", "4"))
DURABLE_API_STREAM_POLL_SECONDS = float(os.environ.get("DURABLE_API_STREAM_POLL_SECONDS", "1"))
DURABLE_API_STREAM_KEEPALIVE_SECONDS = float(
    os.environ.get("DURABLE_API_STREAM_KEEPALIVE_SECONDS", "10")
)
# Comma-separated operation names clients may submit or schedule, on top of each
# operation's access rule (Operation.access); empty: every one that rule allows.
DURABLE_API_OPERATIONS = env_list("DURABLE_API_OPERATIONS", "") or None

# --- External services: outbound HTTP, webhooks, mail, credentials (issue 3) -----
# Every variable is in docs/how-to/webhooks-and-mail.md, "Settings and environment".


def env_json(name: str, default: str) -> dict:
    try:
        value = json.loads(os.environ.get(name) or default)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object")
    return value


# Per-provider limits for durable.http; keys and defaults in docs/how-to/outbound-http.md,
# "Outbound HTTP". Example:
# {"webhooks": {"total_timeout": 15, "max_in_flight": 4, "min_spacing_ms": 200}}
DURABLE_HTTP_PROVIDERS = env_json("DURABLE_HTTP_PROVIDERS", "{}")
# Hosts (names or IP literals, exactly as written in URLs) that may be reached
# even though they resolve to private/loopback addresses. Empty: public only.
DURABLE_HTTP_ALLOW_HOSTS = env_list("DURABLE_HTTP_ALLOW_HOSTS", "")
# Fernet key(s) for the encrypted credential table; first encrypts, all decrypt.
DURABLE_CREDENTIAL_KEY = os.environ.get("DURABLE_CREDENTIAL_KEY", "")
# Publish jobs that need attention and error recovery events to webhooks/mail.
DURABLE_NOTIFY_ENGINE_EVENTS = env_bool("DURABLE_NOTIFY_ENGINE_EVENTS", True)

_EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
_SMTP = {
    "host": os.environ.get("EMAIL_HOST", "localhost"),
    "port": int(os.environ.get("EMAIL_PORT", "25")),
    "username": os.environ.get("EMAIL_HOST_USER", ""),
    "use_tls": env_bool("EMAIL_USE_TLS", False),
    "use_ssl": env_bool("EMAIL_USE_SSL", False),
    # Django's default is no timeout at all: a stuck SMTP server would hang a unit.
    "timeout": float(os.environ.get("EMAIL_TIMEOUT", "30")),
}
if django.VERSION >= (6, 1):
    # Django 6.1 configures mail as MAILERS (the EMAIL_* settings are deprecated
    # there); the same environment variables fill it.
    MAILERS = {
        "default": {
            "BACKEND": _EMAIL_BACKEND,
            "OPTIONS": _SMTP if _EMAIL_BACKEND.endswith(".smtp.EmailBackend") else {},
        }
    }
else:
    EMAIL_BACKEND = _EMAIL_BACKEND
    EMAIL_HOST = _SMTP["host"]
    EMAIL_PORT = _SMTP["port"]
    EMAIL_HOST_USER = _SMTP["username"]
    EMAIL_USE_TLS = _SMTP["use_tls"]
    EMAIL_USE_SSL = _SMTP["use_ssl"]
    EMAIL_TIMEOUT = _SMTP["timeout"]
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "durable@localhost")
# Credential reference for the SMTP password (resolved at send time, never stored in settings).
DURABLE_MAIL_PASSWORD_REF = os.environ.get("DURABLE_MAIL_PASSWORD_REF", "")
DURABLE_MAIL_SUBJECT_PREFIX = os.environ.get("DURABLE_MAIL_SUBJECT_PREFIX", "durable")
# --- Built-in operations: backup, restore, db.copy, integrity scans -------------

# Where backup.database writes backups and restore.database reads them. A job
# names a backup (one path component); it never passes a path of its own.
DURABLE_BACKUP_DIR = Path(os.environ.get("DURABLE_BACKUP_DIR", VAR_DIR / "backups"))
# Apps whose tables restore.database never writes: the recovery history is an
# audit log, and a restore must not erase the events that explain it.
DURABLE_RESTORE_KEEP_APPS = env_list("DURABLE_RESTORE_KEEP_APPS", "recovery")

# --- Logging ------------------------------------------------------------------

LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"logfmt": {"()": "durable.logs.LogfmtFormatter"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "logfmt"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
    "loggers": {
        "durable": {
            "handlers": ["stderr"],
            "level": os.environ.get("LOG_LEVEL", "INFO"),
            "propagate": False,
        },
    },
}

# --- Recovery and Security events (docs/explanation/recovery-and-security-events.md) -----

# The JSONL file launch scripts append to. Empty: WEKAN_FERRETDB_SQLITE_DIR,
# FERRETDB_SQLITE_DIR or WEKAN_SQLITE_DIR plus /recovery-events.jsonl; none set
# means no automatic ingest.
RECOVERY_EVENTS_FILE = os.environ.get("RECOVERY_EVENTS_FILE", "")
# Seconds between a worker's looks at the file (0 = only when a worker starts).
RECOVERY_INGEST_INTERVAL = float(os.environ.get("RECOVERY_INGEST_INTERVAL", "60"))
LOGGING["loggers"]["recovery"] = {
    "handlers": ["stderr"],
    "level": os.environ.get("LOG_LEVEL", "INFO"),
    "propagate": False,
}

# --- Schedules, file moves, imports (docs/how-to/schedules.md, move-files.md and
# import-recovery-events.md) --------------------------------------------------------------

# The standing "retention" schedule purges finished jobs older than this
# (30d, 12h, ...); "off" removes the schedule. It runs at DURABLE_RETENTION_CRON
# (5-field cron, on the TIME_ZONE wall clock).
DURABLE_RETENTION = os.environ.get("DURABLE_RETENTION", "30d")
DURABLE_RETENTION_CRON = os.environ.get("DURABLE_RETENTION_CRON", "30 3 * * *")


def _file_storages(value: str) -> dict[str, dict]:
    """FILE_STORAGES="archive=/srv/archive,uploads=/srv/uploads": FileSystemStorage aliases."""
    found: dict[str, dict] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        alias, sep, root = (text.strip() for text in item.partition("="))
        if not sep or not alias.replace("-", "_").isidentifier() or not root:
            raise ImproperlyConfigured(f"FILE_STORAGES: {item!r} is not name=/absolute/path")
        if not os.path.isabs(root):
            raise ImproperlyConfigured(f"FILE_STORAGES: the root of {alias!r} must be absolute")
        found[alias] = {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": root, "base_url": None},
        }
    return found


# Storages files.move can name, besides those in STORAGES ("default", ...).
FILE_STORAGES = _file_storages(os.environ.get("FILE_STORAGES", ""))
for _alias in FILE_STORAGES:
    if _alias in STORAGES:
        raise ImproperlyConfigured(f"FILE_STORAGES: {_alias!r} is already in STORAGES")
STORAGES.update(FILE_STORAGES)
# Directories import.jsonl / import.csv may read from (comma-separated); the
# default var/imports is created when first needed. Never "anywhere": whoever
# starts an import names a file the worker reads.
RECOVERY_IMPORT_DIRS = env_list("RECOVERY_IMPORT_DIRS", str(VAR_DIR / "imports"))


# --- Problems dashboard (docs/reference/dashboard.md) ---------------------------------------

# How many reverse proxies of your own stand in front of the site. 0: the
# X-Forwarded-For header is ignored and the TCP peer is the client (right when
# gunicorn faces the network). N: the N-th address from the right of
# X-Forwarded-For is the client; the ones left of it are not believed.
TRUSTED_PROXY_COUNT = int(os.environ.get("TRUSTED_PROXY_COUNT", "0"))
if TRUSTED_PROXY_COUNT < 0:
    raise ImproperlyConfigured("TRUSTED_PROXY_COUNT must be 0 or more")
# No inline scripts or styles anywhere. Unset: recovery.dashboard.csp.DEFAULT_POLICY
# (the one place the policy is written); "" sends no header.
CONTENT_SECURITY_POLICY = os.environ.get("CONTENT_SECURITY_POLICY")
MIDDLEWARE.insert(
    MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
    "recovery.dashboard.csp.ContentSecurityPolicyMiddleware",
)
# htmx sends the CSRF token from the page (hx-headers), so scripts never need the cookie.
CSRF_COOKIE_HTTPONLY = True
# A refused POST answered in the dashboard's words (and to htmx, as a message).
CSRF_FAILURE_VIEW = "recovery.dashboard.access.csrf_failure"
SESSION_COOKIE_SAMESITE = "Lax"
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
