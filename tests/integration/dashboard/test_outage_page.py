"""A dashboard page while the database is unreachable: 503, Retry-After and a short page.

Not a 500 and a traceback per request: ``DatabaseUnavailableMiddleware`` (in the
site's MIDDLEWARE). Both databases: the connection really fails.
"""

from __future__ import annotations

import logging

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.integration.helpers import unreachable_database

# The test's own transaction would be lost with its connection: these tests commit.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("path", ["/problems/", "/problems/jobs/", "/problems/recovery/"])
def test_dashboard__503_page_with_retry_after(caplog, path):
    user = User.objects.create_user("outage-admin", password="pw", is_staff=True, is_superuser=True)
    browser = Client(raise_request_exception=False)
    browser.force_login(user)
    caplog.set_level(logging.INFO)
    with unreachable_database():
        response = browser.get(path)
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response["Content-Type"] == "text/html; charset=utf-8"
    assert b"Temporarily unavailable" in response.content
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in errors] == ["request failed: database unreachable"]
    assert errors[0].exc_info is None
    assert browser.get(path).status_code == 200
