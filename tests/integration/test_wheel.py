"""The built wheel, installed into a fresh ``startproject`` site, is the whole product.

Builds the wheel from the checkout, installs it into a new virtual environment (the
apps' declared dependencies only, at the versions this test run uses), appends the
embedding of docs/how-to/embed-in-your-site.md to a new site, and runs it as a user
would: ``check``, ``migrate``, a ``durable.noop`` job through ``runworker --burst``,
and the dashboard's pages with their static files through ``runserver`` as a
logged-in superuser. On the PostgreSQL leg the site uses a PostgreSQL database of its
own. Each CI leg runs it on its own Django line.

No index is asked for what is already here: the dependencies' wheels are kept in
``var/wheelhouse/`` and fetched (from pip's cache, usually) only when missing.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import django
import pytest
from django.conf import settings

from tests.docs.snippets import find

from .sites import on_postgres, own_database, postgres, run, runserver

ROOT = Path(__file__).resolve().parents[2]
HOWTO = "docs/how-to/embed-in-your-site.md"
# What the wheel is built from (a copy, so no build/ or egg-info is left in the checkout).
SOURCES = ("durable", "recovery", "templates", "static")
FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md")
PAGES = ("/problems/", "/problems/jobs/", "/problems/recovery/", "/problems/queues/")
EXTRA = "[django52]" if django.VERSION < (6,) else ""  # the backport on Django 5.2 only
ADMIN = ("wheel-admin", "wheel-admin-password-1")

pytestmark = pytest.mark.slow


def build_wheel(tmp: Path) -> Path:
    source = tmp / "source"
    for name in SOURCES:
        shutil.copytree(
            ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    for name in FILES:
        shutil.copy2(ROOT / name, source / name)
    dist = tmp / "dist"
    # The build backend of this test venv (setuptools from the dev extra): no download.
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), "."],
        source,
        {**os.environ},
    )
    (wheel,) = dist.glob("restart_safe-*.whl")
    return wheel


def install(wheel: Path, venv: Path, tmp: Path) -> None:
    """The wheel and its declared dependencies, at this run's versions, into ``venv``."""
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, {**os.environ})
    constraints = tmp / "constraints.txt"
    constraints.write_text(
        "".join(
            f"{dist.metadata['Name']}=={dist.version}\n"
            for dist in importlib.metadata.distributions()
            if dist.metadata["Name"] and dist.metadata["Name"].lower() != "restart-safe"
        )
    )
    wheelhouse = (
        Path(settings.VAR_DIR) / "wheelhouse" / f"py{sys.version_info[0]}{sys.version_info[1]}"
    )
    wheelhouse.mkdir(parents=True, exist_ok=True)
    pip = [
        sys.executable,
        "-m",
        "pip",
        "--disable-pip-version-check",
        "--python",
        str(venv / "bin" / "python"),
    ]
    args = ["-q", "-c", str(constraints), f"{wheel}{EXTRA}"]
    offline = [*pip, "install", "--no-index", "--find-links", str(wheelhouse), *args]
    done = subprocess.run(
        offline, cwd=tmp, capture_output=True, text=True, timeout=240, check=False
    )
    if done.returncode != 0:  # a dependency not in the wheelhouse yet: fetch it once
        download = [sys.executable, "-m", "pip", "download", "--only-binary", ":all:"]
        run([*download, "-d", str(wheelhouse), *args], tmp, {**os.environ})
        for ours in wheelhouse.glob("restart_safe-*.whl"):
            ours.unlink()
        run(offline, tmp, {**os.environ})


def database_settings(tmp: Path) -> tuple[str, str | None]:
    """The fresh site's DATABASES line (this leg's vendor), and a PostgreSQL name to drop."""
    default = settings.DATABASES["default"]
    if not on_postgres():
        return f"DATABASES['default']['NAME'] = {str(tmp / 'site.sqlite3')!r}\n", None
    name = own_database("wheel")
    config = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        **{key: default[key] for key in ("USER", "PASSWORD", "HOST", "PORT")},
    }
    return f"DATABASES = {{'default': {config!r}}}\n", name


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    venv, project = tmp_path / "venv", tmp_path / "site"
    install(build_wheel(tmp_path), venv, tmp_path)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV"}
    }
    env |= {"PATH": f"{venv / 'bin'}:{env.get('PATH', '')}", "PYTHONUNBUFFERED": "1"}
    python = str(venv / "bin" / "python")
    project.mkdir()
    run(
        [python, "-m", "django", "startproject", "mysite", str(project)],
        tmp_path,
        env,
    )
    databases, pg_name = database_settings(tmp_path)
    with (project / "mysite" / "settings.py").open("a") as handle:
        handle.write("\n" + find(HOWTO, "INSTALLED_APPS +=").code + databases)
    with (project / "mysite" / "urls.py").open("a") as handle:
        handle.write("\n" + find(HOWTO, "urlpatterns +=").code)
    if pg_name:
        postgres(f'DROP DATABASE IF EXISTS "{pg_name}"')
        postgres(f'CREATE DATABASE "{pg_name}"')
    try:
        yield project, venv, env
    finally:
        if pg_name:
            postgres(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')


def test_the_wheel_in_a_fresh_site(site: tuple[Path, Path, dict[str, str]]) -> None:
    project, venv, env = site
    python = str(venv / "bin" / "python")
    manage = [python, "manage.py"]
    # The apps come from the installed wheel, not from this checkout.
    where = run([python, "-c", "import durable, recovery; print(recovery.__file__)"], project, env)
    assert where.strip().startswith(str(venv)), where
    # Only the apps' own dependencies: not this repository's server parts, and no
    # backport on Django 6 (django.tasks is built in).
    unwanted = ["gunicorn", "whitenoise", "dj_database_url"]
    unwanted += ["django_tasks"] if not EXTRA else []
    probe = f"import importlib.util as u; print([m for m in {unwanted!r} if u.find_spec(m)])"
    assert run([python, "-c", probe], project, env).strip() == "[]"
    run([*manage, "check", "--fail-level", "WARNING"], project, env)
    run([*manage, "migrate", "--noinput", "-v", "0"], project, env)
    found = run(
        [
            *manage,
            "findstatic",
            "problems/problems.css",
            "problems/problems.js",
            "vendor/htmx/htmx.min.js",
            "-v",
            "0",
        ],
        project,
        env,
    )
    assert found.count(str(venv)) == 3, found  # each from the installed recovery app

    enqueued = run(
        [*manage, "enqueue_job", "durable.noop", "--input", '{"units": 3}'], project, env
    )
    job_id = int(re.search(r"enqueued job (\d+)", enqueued)[1])
    run([*manage, "runworker", "--burst"], project, env)
    state = run(
        [
            *manage,
            "shell",
            "--no-imports",
            "-c",
            f"from durable.models import Job; print(Job.objects.get(pk={job_id}).state)",
        ],
        project,
        env,
    )
    assert state.strip() == "completed"

    username, password = ADMIN
    run(
        [
            *manage,
            "createsuperuser",
            "--noinput",
            "--username",
            username,
            "--email",
            "a@example.com",
        ],
        project,
        {**env, "DJANGO_SUPERUSER_PASSWORD": password},
    )
    log = project / "runserver.log"
    with runserver(manage, project, env, log, "/problems/login/") as (client, login_page):
        base = str(client.base_url).rstrip("/")
        assert login_page.status_code == 200
        # Not logged in: the dashboard sends the visitor to its own login page.
        assert client.get("/problems/").headers["location"].startswith("/problems/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page.text)[1]
        logged_in = client.post(
            "/problems/login/",
            data={"username": username, "password": password, "csrfmiddlewaretoken": token},
            headers={"Referer": f"{base}/problems/login/"},
        )
        assert logged_in.status_code == 302, logged_in.text
        assets: set[str] = set()
        for page in PAGES:
            response = client.get(page)
            assert response.status_code == 200, (page, response.text[:2000])
            assert "problems/problems.css" in response.text
            assets |= set(re.findall(r'(?:href|src)="(/static/[^"]+)"', response.text))
        jobs = client.get("/problems/jobs/").text
        assert "durable.noop" in jobs
        assert {"/static/problems/problems.css", "/static/vendor/htmx/htmx.min.js"} <= assets
        for asset in sorted(assets):  # served by runserver through the finders
            response = client.get(asset)
            assert response.status_code == 200, asset
            assert response.content, asset
