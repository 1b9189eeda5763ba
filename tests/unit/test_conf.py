"""Settings defaults (durable.conf, recovery.conf) and the checks of what a site must add."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from durable import checks as durable_checks
from durable import conf
from recovery import checks as recovery_checks

FULL_MIDDLEWARE = [
    recovery_checks.SESSION_MIDDLEWARE,
    recovery_checks.AUTH_MIDDLEWARE,
    recovery_checks.HTMX_MIDDLEWARE,
]


def test_apply_defaults__sets_only_what_the_site_did_not():
    site = SimpleNamespace(DURABLE_LEASE_SECONDS=5.0, BASE_DIR=Path("/srv/site"))
    applied = conf.apply_defaults(site, conf.DEFAULTS, conf.DERIVED)
    assert site.DURABLE_LEASE_SECONDS == 5.0  # the site's own value stays
    assert "DURABLE_LEASE_SECONDS" not in applied
    assert site.DURABLE_POLL_INTERVAL == 1.0
    assert Path("/srv/site/var/backups") == site.DURABLE_BACKUP_DIR
    assert set(applied) == (set(conf.DEFAULTS) | set(conf.DERIVED)) - {"DURABLE_LEASE_SECONDS"}


def test_apply_defaults__mutable_defaults_are_copies():
    first, second = SimpleNamespace(), SimpleNamespace()
    conf.apply_defaults(first, conf.DEFAULTS)
    conf.apply_defaults(second, conf.DEFAULTS)
    first.DURABLE_HTTP_PROVIDERS["x"] = {}
    first.DURABLE_RESTORE_KEEP_APPS.append("other")
    assert second.DURABLE_HTTP_PROVIDERS == {} == conf.DEFAULTS["DURABLE_HTTP_PROVIDERS"]
    assert second.DURABLE_RESTORE_KEEP_APPS == ["recovery"]


def test_apply_defaults__no_base_dir_leaves_the_backup_dir_unset_for_the_check():
    site = SimpleNamespace()
    conf.apply_defaults(site, conf.DEFAULTS, conf.DERIVED)
    assert site.DURABLE_BACKUP_DIR is None
    ids = [m.id for m in durable_checks.settings_problems(site, tasks_framework=True)]
    assert ids == ["durable.E001"]


def test_durable_checks__a_site_with_defaults_passes():
    site = SimpleNamespace(BASE_DIR=Path("/srv/site"))
    conf.apply_defaults(site, conf.DEFAULTS, conf.DERIVED)
    assert durable_checks.settings_problems(site, tasks_framework=False) == []


@pytest.mark.parametrize(
    ("framework", "expected"),
    [
        (True, []),  # Django 6's django.tasks, or the backport on 5.2
        (False, ["durable.E002"]),  # Django 5.2 without the backport
    ],
)
def test_durable_checks__tasks_backend_needs_the_framework(framework, expected):
    site = SimpleNamespace(
        DURABLE_BACKUP_DIR=Path("/b"), TASKS={"default": {"BACKEND": durable_checks.BACKEND}}
    )
    found = durable_checks.settings_problems(site, tasks_framework=framework)
    assert [m.id for m in found] == expected
    if found:
        assert "restart-safe[django52]" in found[0].hint


PG = {"ENGINE": "django.db.backends.postgresql"}


@pytest.mark.parametrize(
    ("listen_url", "default", "expected"),
    [
        ("", PG, []),  # no pooler said: nothing to check
        ("postgres://db:5432/app", PG, ["durable.W001"]),  # pooler, server-side cursors on
        ("postgres://db:5432/app", {**PG, "DISABLE_SERVER_SIDE_CURSORS": True}, []),
        ("postgres://db:5432/app", {"ENGINE": "django.db.backends.sqlite3"}, []),  # moot
    ],
)
def test_durable_checks__behind_a_pooler_server_side_cursors_are_off(listen_url, default, expected):
    site = SimpleNamespace(BASE_DIR=Path("/srv/site"))
    conf.apply_defaults(site, conf.DEFAULTS, conf.DERIVED)
    site.DURABLE_LISTEN_URL = listen_url
    site.DATABASES = {"default": default}
    found = durable_checks.settings_problems(site, tasks_framework=True)
    assert [m.id for m in found] == expected


def _recovery(site, *, installed=True, templates=True):
    return [
        m.id
        for m in recovery_checks.settings_problems(
            site, is_installed=lambda name: installed, template_found=lambda: templates
        )
    ]


def test_recovery_checks__the_minimal_embedding_passes():
    site = SimpleNamespace(MIDDLEWARE=FULL_MIDDLEWARE, BASE_DIR=Path("/srv/site"))
    assert _recovery(site) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"installed": False}, ["recovery.E001"]),  # durable not installed
        ({"middleware": FULL_MIDDLEWARE[:2]}, ["recovery.E002"]),  # no HtmxMiddleware
        ({"middleware": FULL_MIDDLEWARE[1:]}, ["recovery.E003"]),  # no sessions
        ({"middleware": []}, ["recovery.E002", "recovery.E003", "recovery.E003"]),
        ({"base_dir": None}, ["recovery.E004"]),
        ({"templates": False}, ["recovery.E005"]),  # APP_DIRS off
    ],
)
def test_recovery_checks__each_missing_piece_is_named(change, expected):
    site = SimpleNamespace(
        MIDDLEWARE=change.get("middleware", FULL_MIDDLEWARE),
        BASE_DIR=change.get("base_dir", Path("/srv/site")),
    )
    found = _recovery(
        site, installed=change.get("installed", True), templates=change.get("templates", True)
    )
    assert found == expected


def test_this_sites_environment_defaults_are_the_apps_defaults(monkeypatch):
    """recovery/settings.py reads the same settings from the environment; unset, each
    variable must give the apps' own default, or the standalone site and an embedding
    site would behave differently for the same (empty) configuration."""
    import runpy

    from recovery import conf as recovery_conf

    defaults = {**conf.DEFAULTS, **recovery_conf.DEFAULTS}
    for name in [*defaults, *conf.DERIVED, "VAR_DIR"]:
        monkeypatch.delenv(name, raising=False)
    site = runpy.run_path(str(Path(__file__).resolve().parents[2] / "recovery" / "settings.py"))
    compared = [name for name in defaults if name in site]
    assert len(compared) >= 25  # the site defines nearly all of them
    for name in compared:
        if name == "RECOVERY_IMPORT_DIRS":  # [] means BASE_DIR/var/imports, which it spells out
            assert site[name] == [str(Path(site["BASE_DIR"]) / "var" / "imports")]
            continue
        assert site[name] == defaults[name], name
    assert site["DURABLE_BACKUP_DIR"] == conf.DERIVED["DURABLE_BACKUP_DIR"](
        SimpleNamespace(BASE_DIR=site["BASE_DIR"])
    )
