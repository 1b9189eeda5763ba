"""``manage.py ensure_admin``, which ``make run`` calls before every start: it must never fail."""

from __future__ import annotations

import io
import stat

import pytest
from django.contrib.auth import authenticate
from django.contrib.auth.models import User
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def run() -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("ensure_admin", stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def var_dir(settings, tmp_path, monkeypatch):
    monkeypatch.delenv("ADMIN_USERNAME", raising=False)
    monkeypatch.delenv("ADMIN_PASSWORD", raising=False)
    settings.VAR_DIR = tmp_path / "var"  # the setting, not recovery.settings' module constant
    return settings.VAR_DIR


def test_creates_admin_with_a_generated_password_in_var(var_dir):
    out, _ = run()
    path = var_dir / "admin-password"
    assert f"Created administrator 'admin'; the password is in {path}." in out
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    user = authenticate(username="admin", password=path.read_text().strip())
    assert user is not None
    assert (user.is_superuser, user.is_staff) == (True, True)


def test_takes_name_and_password_from_the_environment(var_dir, monkeypatch):
    monkeypatch.setenv("ADMIN_USERNAME", "root")
    monkeypatch.setenv("ADMIN_PASSWORD", "s3cret-pw")
    out, _ = run()
    assert "the password is in ADMIN_PASSWORD" in out
    assert authenticate(username="root", password="s3cret-pw").is_superuser
    assert not (var_dir / "admin-password").exists()


def test_an_existing_superuser_is_left_alone(var_dir):
    User.objects.create_superuser("boss", "", "pw")
    out, _ = run()
    assert "An administrator exists" in out
    assert User.objects.count() == 1
    assert not var_dir.exists()


def test_an_ordinary_user_holding_the_name_is_not_promoted_and_nothing_fails(var_dir):
    # create_superuser used to raise IntegrityError here, and `make run` stopped.
    User.objects.create_user("admin", password="theirs")
    _, err = run()
    assert "ordinary account: left unchanged" in err
    assert "ADMIN_USERNAME" in err
    user = User.objects.get(username="admin")
    assert (user.is_superuser, user.is_staff) == (False, False)
    assert user.check_password("theirs")
    assert not User.objects.filter(is_superuser=True).exists()
    assert not var_dir.exists()  # no password written for an account that was not made
