"""docs/reference/settings.md names every environment variable and setting the code reads."""

from __future__ import annotations

from pathlib import Path

import envscan

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "settings.md"


def test_every_variable_the_code_reads_is_documented() -> None:
    missing = envscan.missing(PAGE.read_text(encoding="utf-8"))
    assert missing == [], "read by the code, absent from docs/reference/settings.md: " + ", ".join(
        f"{read.name} ({read.where})" for read in missing
    )


def test_every_read_has_a_name_the_scan_understands() -> None:
    _, unresolved = envscan.scan()
    assert unresolved == []


def test_the_scan_finds_each_kind_of_read() -> None:
    """Without this the two tests above would pass on a scan that finds nothing."""
    reads = {(read.name, read.kind) for read in envscan.scan()[0]}
    expected = {
        ("DATABASE_URL", "environment"),  # os.environ.get("DATABASE_URL", ...)
        ("DEBUG", "environment"),  # env_bool("DEBUG", False): a helper called with a name
        ("ALLOWED_HOSTS", "environment"),  # env_list(...)
        ("DURABLE_HTTP_PROVIDERS", "environment"),  # env_json(...)
        ("WEKAN_SQLITE_DIR", "environment"),  # for name in WEKAN_DIR_VARIABLES
        ("DURABLE_CREDENTIAL_<NAME>", "environment"),  # computed name, listed in DYNAMIC
        ("BIND", "environment"),  # gunicorn.conf.py
        ("ADMIN_PASSWORD", "environment"),  # a management command
        ("DURABLE_MAIL_FROM", "setting"),  # getattr(settings, ...), no variable
        ("DURABLE_API_STREAM_SECONDS", "setting"),  # _setting("...") helper in the API
    }
    assert expected <= reads, expected - reads


def test_a_name_missing_from_the_page_is_reported() -> None:
    text = PAGE.read_text(encoding="utf-8").replace("`DURABLE_MAIL_FROM`", "DURABLE_MAIL_FROM")
    assert [read.name for read in envscan.missing(text)] == ["DURABLE_MAIL_FROM"]
