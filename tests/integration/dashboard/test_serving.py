"""Production serving: security headers, a Content-Security-Policy the pages really obey
(no inline script, style or handler anywhere), and gunicorn + WhiteNoise with the production
settings after collectstatic."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import pytest
from django.http import HttpResponse
from django.test import RequestFactory
from django.urls import reverse

from recovery.dashboard.csp import DEFAULT_POLICY, ContentSecurityPolicyMiddleware
from recovery.records import record_event, record_security
from tests.conftest import BASE_DIR, database_url

from .server import Gunicorn

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(client_for):
    return client_for("admin")


def test_headers__on_pages_admin_and_api(admin):
    for url in ("/problems/", "/problems/recovery/", "/admin/", "/api/openapi.json"):
        response = admin.get(url)
        csp = response["Content-Security-Policy"]
        assert "default-src 'self'" in csp
        assert "script-src 'self'" in csp
        assert "'unsafe-inline'" not in csp
        assert "frame-ancestors 'none'" in csp
        assert response["X-Frame-Options"] == "DENY"
        assert response["X-Content-Type-Options"] == "nosniff"
        assert response["Referrer-Policy"] == "same-origin"


@pytest.mark.parametrize(
    ("configured", "sent"),
    [(None, DEFAULT_POLICY),  # unset: the one default, written in csp.py only
     ("", None),  # empty: no header
     ("default-src 'none'", "default-src 'none'")],
)  # fmt: skip
def test_csp__the_setting_or_the_single_default(settings, configured, sent):
    settings.CONTENT_SECURITY_POLICY = configured
    middleware = ContentSecurityPolicyMiddleware(lambda request: HttpResponse("ok"))
    response = middleware(RequestFactory().get("/"))
    assert response.get("Content-Security-Policy") == sent


def test_csp__settings_do_not_repeat_the_policy():
    source = (BASE_DIR / "recovery" / "settings.py").read_text()
    assert "default-src" not in source


def test_cookies__session_and_csrf_are_httponly(client, make_user):
    make_user("readonly", "rita")
    page = client.get(reverse("problems:login"))
    assert page.cookies["csrftoken"]["httponly"] is True
    response = client.post(reverse("problems:login"), {"username": "rita", "password": "pw"})
    assert response.cookies["sessionid"]["httponly"] is True
    assert response.cookies["sessionid"]["samesite"] == "Lax"


INLINE = [
    (r"<script(?![^>]*\bsrc=)[^>]*>", "an inline <script>"),
    (r"\son[a-z]+\s*=", "an inline event handler"),
    (r"\sstyle\s*=", "a style attribute"),
    (r"<style", "a <style> element"),
    (r"javascript:", "a javascript: URL"),
    (r"hx-on", "hx-on (needs eval)"),
]


def test_no_page_needs_unsafe_inline(admin, make_job, client):
    running = make_job("running")
    make_job("failed")
    record_event("t", detail="plain", job_id=running.pk)
    record_security(category="ssrf", key="x", username="u", ip="192.0.2.1")
    names = ("summary", "recovery", "security", "jobs")
    pages = [admin.get(reverse(f"problems:{name}")) for name in names]
    pages += [
        admin.get(reverse("problems:job", args=[running.pk])),
        admin.get(reverse("problems:new-job"), {"operation": "durable.noop"}),
        admin.post(reverse("problems:bulk"), {"action": "pause", "scope": "filter"}),
        admin.get(reverse("problems:jobs"), headers={"HX-Request": "true"}),
        client.get(reverse("problems:login")),
    ]
    for response in pages:
        html = response.content.decode()
        assert response.status_code == 200
        for pattern, what in INLINE:
            found = re.search(pattern, html, re.IGNORECASE)
            assert found is None, f"{what} in {response.wsgi_request.path}: {found.group(0)!r}"


def test_htmx_is_told_not_to_inject_styles_or_eval(admin):
    html = admin.get(reverse("problems:summary")).content.decode()
    config = html.split('<meta name="htmx-config" content=\'', 1)[1].split("'", 1)[0]
    parsed = json.loads(config)
    assert parsed["includeIndicatorStyles"] is False
    assert parsed["allowEval"] is False
    assert parsed["historyCacheSize"] == 0  # no page copies (addresses, names) in localStorage
    assert '/static/vendor/htmx/htmx.min.js"' in html


@pytest.mark.slow
def test_production__collectstatic_then_gunicorn_serves_hashed_static_files(tmp_path):
    env = {
        "DJANGO_SETTINGS_MODULE": "recovery.settings",
        "DATABASE_URL": database_url(),
        "VAR_DIR": str(tmp_path),
        "PATH": "/usr/bin:/bin",
    }
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "--verbosity", "0"],
        cwd=BASE_DIR, env=env, check=True, timeout=120,
    )  # fmt: skip
    assert (tmp_path / "staticfiles" / "staticfiles.json").exists()
    server = Gunicorn(tmp_path, settings="recovery.settings", VAR_DIR=str(tmp_path)).start()
    try:
        page = httpx.get(f"{server.url}/problems/login/", timeout=10)
        assert page.status_code == 200
        assert page.headers["X-Frame-Options"] == "DENY"
        assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
        css = re.search(r'href="(/static/problems/problems\.[0-9a-f]{12}\.css)"', page.text)
        assert css, page.text[:1000]
        manifest = json.loads((tmp_path / "staticfiles" / "staticfiles.json").read_text())
        htmx = "/static/" + manifest["paths"]["vendor/htmx/htmx.min.js"]
        for path in (css.group(1), htmx):
            static = httpx.get(f"{server.url}{path}", headers={"Accept-Encoding": "gzip"})
            assert static.status_code == 200
            assert "immutable" in static.headers["Cache-Control"]  # hashed: cached for ever
            assert static.headers.get("Content-Encoding") == "gzip"
        anonymous = httpx.get(f"{server.url}/problems/", timeout=10)
        assert anonymous.status_code == 302
        assert anonymous.headers["Location"] == "/problems/login/?next=/problems/"
    finally:
        server.close()
