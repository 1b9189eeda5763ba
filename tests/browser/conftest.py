"""Browser tests: Debian's Chromium driven by Playwright against a real gunicorn.

``playwright install`` cannot download browsers here (closed network), so the
system's ``/usr/bin/chromium`` is launched directly. Without it the tests are
skipped on a developer machine and *fail* under CI (``CI`` set), so a CI image
that lost its browser cannot go green silently; ``.ci/run`` installs it.

Every page a test opens is watched: a console error (a CSP violation, a failed
request, a JavaScript exception) fails the test. Each test saves screenshots
under ``var/screenshots/``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.conftest import BASE_DIR
from tests.integration.dashboard.server import Gunicorn

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
SCREENSHOTS = BASE_DIR / "var" / "screenshots"
TIMEOUT_MS = 20_000


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"browser tests cannot run under CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover - a dev dependency
        _unavailable("the playwright package is not installed (pip install -e '.[dev]')")
    if not Path(CHROMIUM).exists():
        _unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    # Playwright's sync API keeps an event loop in this thread; Django's guard
    # against ORM calls from async code cannot tell it from real async code.
    # Nothing async touches the ORM here, so the guard is lifted while it runs.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                yield browser
            finally:
                browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="module")
def site(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Gunicorn]:
    """One gunicorn for the module, on the test database (rows must be committed:
    the tests use ``transaction=True``)."""
    server = Gunicorn(tmp_path_factory.mktemp("gunicorn"), DURABLE_POLL_INTERVAL="0.05")
    with django_db_blocker.unblock():
        server.start(workers=3)
    try:
        yield server
    finally:
        server.close()


class Ui:
    """One browser context (its own cookies) and page, with console errors collected."""

    def __init__(self, browser: Any, site: Gunicorn, name: str) -> None:
        self.site = site
        self.name = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        self.context = browser.new_context(viewport={"width": 1360, "height": 900})
        self.context.set_default_timeout(TIMEOUT_MS)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.errors.append(f"pageerror: {error}"))
        self.page.on("dialog", lambda dialog: dialog.accept())  # hx-confirm: "Cancel job 5?"

    def _console(self, message: Any) -> None:
        if message.type in ("error", "assert"):
            self.errors.append(f"console.{message.type} on {self.page.url}: {message.text}")

    def url(self, path: str) -> str:
        return self.site.url + path

    def go(self, path: str) -> Any:
        response = self.page.goto(self.url(path))
        self.page.wait_for_load_state("networkidle")
        return response

    def login(self, username: str, password: str = "pw", next_path: str = "/problems/") -> None:
        self.page.goto(self.url(f"/problems/login/?next={next_path}"))
        self.page.fill("#id_username", username)
        self.page.fill("#id_password", password)
        self.page.click("button[type=submit]")
        self.page.wait_for_url(re.compile(re.escape(self.url(next_path)) + r"$"))

    def mark(self) -> None:
        """Remember this document: ``same_document()`` is False after any full page load."""
        self.page.evaluate("window.__marked = true")

    def same_document(self) -> bool:
        return bool(self.page.evaluate("window.__marked === true"))

    def shot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def ui(chromium, site, request) -> Iterator[Ui]:
    session = Ui(chromium, site, request.node.name)
    try:
        yield session
    finally:
        session.context.close()
    assert session.errors == [], "\n".join(session.errors)


@pytest.fixture
def staff(transactional_db) -> User:
    """A superuser to log in with (committed: gunicorn reads it)."""
    return User.objects.create_superuser("admin", "", "pw")
