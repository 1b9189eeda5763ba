"""The encrypted credential table, its command, its resolver, key rotation, and the admin pages."""

from __future__ import annotations

import io
import sys

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.core.management.base import CommandError

from durable import credential_store, credentials, jobs
from durable.credential_store import Credential
from durable.errors import Unavailable
from durable.webhooks.models import Delivery, Endpoint

from ..helpers import drain

pytestmark = pytest.mark.django_db

SECRET = "ghp-like-but-not-real-0123456789"


def run(*args: str, stdin: str = "") -> str:
    out = io.StringIO()
    saved = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        call_command("credential", *args, stdout=out)
    finally:
        sys.stdin = saved
    return out.getvalue()


def test_store__encrypts_and_resolves_from_the_table():
    credential_store.store("github", SECRET)
    row = Credential.objects.get(name="github")
    assert SECRET not in row.ciphertext
    assert credentials.resolve("github") == SECRET


def test_resolve__settings_and_environment_come_before_the_table(settings, monkeypatch):
    credential_store.store("github", SECRET)
    monkeypatch.setenv("DURABLE_CREDENTIAL_GITHUB", "from-the-environment")
    assert credentials.resolve("github") == "from-the-environment"
    settings.DURABLE_CREDENTIALS = {"github": "from-settings"}
    assert credentials.resolve("github") == "from-settings"


def test_resolve__strips_the_newline_a_file_or_heredoc_leaves(settings, monkeypatch):
    monkeypatch.setenv("DURABLE_CREDENTIAL_GITHUB", f"{SECRET}\n")
    assert credentials.resolve("github") == SECRET
    settings.DURABLE_CREDENTIALS = {"github": f"  {SECRET}\r\n"}
    assert credentials.resolve("github") == SECRET


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("abc", "shorter than 4"),  # would never be redacted
        ("tok\nrest-of-the-secret", "control character"),  # h11 quotes it in its error
        ("tok\x01rest-of-the-secret", "control character"),
    ],
)
def test_resolve__refuses_unusable_values_from_settings_and_environment(
    settings, monkeypatch, value, problem
):
    monkeypatch.setenv("DURABLE_CREDENTIAL_GITHUB", value)
    with pytest.raises(Unavailable, match=problem) as info:
        credentials.resolve("github")
    assert "DURABLE_CREDENTIAL_GITHUB" in str(info.value)  # where to fix it
    assert value not in str(info.value)
    monkeypatch.delenv("DURABLE_CREDENTIAL_GITHUB")
    settings.DURABLE_CREDENTIALS = {"github": value}
    with pytest.raises(Unavailable, match=r"DURABLE_CREDENTIALS\['github'\]"):
        credentials.resolve("github")


def test_job__an_unusable_credential_pauses_it_with_the_reason(settings):
    settings.DURABLE_CREDENTIALS = {"api": "tok\nrest-of-the-secret"}
    job = drain(jobs.enqueue("test.needs_credential", {"token_ref": "api"}).pk)
    assert job.state == "paused"
    assert "control character" in job.reason
    assert "rest-of-the-secret" not in job.reason


def test_rotation__new_key_first_then_rotate_then_drop_the_old(settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.DURABLE_CREDENTIAL_KEY = old
    credential_store.store("github", SECRET)
    settings.DURABLE_CREDENTIAL_KEY = f"{new},{old}"
    assert credentials.resolve("github") == SECRET  # old values still decrypt
    assert credential_store.rotate() == 1
    settings.DURABLE_CREDENTIAL_KEY = new
    assert credentials.resolve("github") == SECRET  # re-encrypted under the new key
    settings.DURABLE_CREDENTIAL_KEY = old
    with pytest.raises(Unavailable, match="cannot be decrypted"):
        credentials.resolve("github")


def test_missing_key__is_an_actionable_pause_not_a_crash(settings):
    credential_store.store("github", SECRET)
    settings.DURABLE_CREDENTIAL_KEY = ""
    with pytest.raises(Unavailable, match="DURABLE_CREDENTIAL_KEY is not set"):
        credentials.resolve("github")
    settings.DURABLE_CREDENTIAL_KEY = "not-a-key"
    with pytest.raises(Unavailable, match="not a valid Fernet key"):
        credentials.resolve("github")


def test_job__resolves_a_stored_credential_and_never_persists_it():
    credential_store.store("api", SECRET)
    job = jobs.enqueue("test.needs_credential", {"token_ref": "api", "leak": True}, max_attempts=1)
    job = drain(job.pk)
    assert job.state == "failed"  # "leak" makes the unit raise with the secret in its message
    assert SECRET not in str(job.errors)
    assert "[redacted]" in job.errors[-1]["message"]
    assert SECRET not in str(list(job.events.values_list("message", "data")))


def test_command__set_list_delete_never_print_the_value():
    out = run("set", "github", "--stdin", stdin=SECRET + "\n")
    assert "stored credential 'github'" in out
    assert credentials.resolve("github") == SECRET
    assert "replaced" in run("set", "github", "--stdin", stdin="another-value\n")
    listing = run("list")
    assert "github" in listing
    assert SECRET not in listing
    assert "another-value" not in listing
    assert "deleted" in run("delete", "github")
    assert not Credential.objects.exists()
    with pytest.raises(CommandError, match="no credential named"):
        run("delete", "github")


@pytest.mark.parametrize(
    ("value", "message"),
    [("abc", "at least 4"), (" padded ", "whitespace"), ("", "at least 4")],
)
def test_command__refuses_values_that_cannot_be_protected(value, message):
    with pytest.raises(CommandError, match=message):
        run("set", "github", "--stdin", stdin=value + "\n")
    assert not Credential.objects.exists()


def test_command__generate_key_prints_a_usable_key():
    key = run("generate-key").strip()
    assert Fernet(key.encode()).decrypt(Fernet(key.encode()).encrypt(b"x")) == b"x"


def test_admin__shows_credential_names_and_deliveries_read_only(admin_client, settings, tmp_path):
    settings.STATIC_ROOT = tmp_path  # WhiteNoise warns about a missing static directory
    credential_store.store("github", SECRET)
    row = Credential.objects.get()
    page = admin_client.get(f"/admin/durable/credential/{row.pk}/change/").content.decode()
    assert "github" in page
    assert SECRET not in page
    assert row.ciphertext not in page
    assert admin_client.get("/admin/durable/credential/add/").status_code == 403

    endpoint = Endpoint.objects.create(
        name="ops", url="https://hooks.example.com/x", secret_ref="s"
    )
    from durable.notify import publish

    publish("job.failed", "evt-admin", {"job_id": 1})
    delivery = Delivery.objects.get()
    assert admin_client.get("/admin/durable/delivery/").status_code == 200
    response = admin_client.post(
        f"/admin/durable/delivery/{delivery.pk}/change/", {"state": "delivered"}
    )
    assert response.status_code == 403
    delivery.refresh_from_db()
    assert delivery.state == "pending"
    # Endpoints are configuration: editable (they hold a secret's name, not the secret).
    assert admin_client.get(f"/admin/durable/endpoint/{endpoint.pk}/change/").status_code == 200
