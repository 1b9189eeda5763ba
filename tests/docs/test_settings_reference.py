"""docs/reference/settings.md names every environment variable and setting the code reads."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import envscan

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "settings.md"
# This repository's own site: its settings module, server config and launcher.
SITE_FILES = ("recovery/settings.py", "gunicorn.conf.py", "manage.py")


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


def _defaults_table() -> dict[str, str]:
    """The "Settings and their defaults" table: setting -> its Default cell (unquoted)."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## Settings and their defaults", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \| `([^`]*)` \|", section, re.MULTILINE)
    return dict(rows)


def test_the_defaults_table_lists_every_app_setting_with_its_default() -> None:
    from durable import conf as durable_conf
    from recovery import conf as recovery_conf

    table = _defaults_table()
    literal = {**durable_conf.DEFAULTS, **recovery_conf.DEFAULTS}
    assert sorted(table) == sorted([*literal, *durable_conf.DERIVED])
    for name, default in literal.items():
        assert ast.literal_eval(table[name]) == default, name
    # The one computed default, stated as the expression the apps compute.
    assert table["DURABLE_BACKUP_DIR"] == "BASE_DIR / 'var/backups'"


def test_every_setting_the_apps_read_has_a_default_in_the_apps() -> None:
    """A setting read by durable or recovery and defined only in this site's settings
    would be an AttributeError in any other site."""
    from django.conf import global_settings

    from durable import conf as durable_conf
    from recovery import conf as recovery_conf

    defaulted = {*durable_conf.DEFAULTS, *durable_conf.DERIVED, *recovery_conf.DEFAULTS}
    found = envscan.scan()[0]
    reads = {r.name for r in found if r.kind == "setting" and not r.where.startswith(SITE_FILES)}
    # Read from the environment by the apps themselves (DURABLE_FAULTS, ...), not settings.
    environment = {r.name for r in found if r.kind == "environment"}
    # The project directory (checked: recovery.E004), and Django's own TASKS and
    # MAILERS (Django 6.x; not in Django 5.2's global_settings).
    not_ours = {"BASE_DIR", "VAR_DIR", "TASKS", "MAILERS", *dir(global_settings)}
    missing = reads - defaulted - environment - not_ours
    assert missing == set()
