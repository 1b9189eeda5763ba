"""Settings of a site that installs the engine alone (tests/integration/test_engine_alone.py).

Nothing from this repository's site (recovery.settings): only what a Django
project of its own would have, plus ``durable``. The test names the database
through ENGINE_SITE_SQLITE or ENGINE_SITE_POSTGRES (a database name on the local
server) and the project directory through ENGINE_SITE_DIR.
"""

import os
from pathlib import Path

BASE_DIR = Path(os.environ.get("ENGINE_SITE_DIR", Path(__file__).resolve().parent))
SECRET_KEY = "engine-site-tests-only-" + "x" * 40
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "durable"]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
]
ROOT_URLCONF = "tests.enginesite.urls"
TEMPLATES = [
    {"BACKEND": "django.template.backends.django.DjangoTemplates", "DIRS": [], "APP_DIRS": True}
]
if name := os.environ.get("ENGINE_SITE_POSTGRES"):
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": "postgres",
            "HOST": "127.0.0.1",
            "PORT": 5432,
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("ENGINE_SITE_SQLITE", str(BASE_DIR / "db.sqlite3")),
        }
    }
USE_TZ = True
TASKS = {"default": {"BACKEND": "durable.tasks.DurableBackend"}}
