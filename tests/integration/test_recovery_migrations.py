"""Migration 0004 on a database with cursors in it: per-name cursors become per-file ones.

``transaction=True``: migrations run outside the test's transaction (and, on
SQLite, cannot run inside one).
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from recovery.dashboard import sql
from recovery.models import IngestCursor, IngestPath

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BEFORE = [("recovery", "0003_dashboard")]
AFTER = [("recovery", "0004_ingest_files_and_type_check")]


def migrate(targets: list[tuple[str, str]]):
    """Migrate to ``targets``; the app registry of that state."""
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return MigrationExecutor(connection).loader.project_state(targets).apps


@pytest.fixture
def at_0003():
    old = migrate(BEFORE)
    try:
        yield old
    finally:
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())  # as the suite expects


def test_0004__gives_each_cursor_its_name_and_merges_two_names_of_one_file(at_0003):
    old_cursor = at_0003.get_model("recovery", "IngestCursor")
    # The same file (1:2) imported under two names: the bug 0004 fixes.
    behind = old_cursor.objects.create(path="/a/x.jsonl", tag="aaaa", file_id="1:2", offset=100)
    ahead = old_cursor.objects.create(
        path="/b/x.jsonl", tag="bbbb", file_id="1:2", offset=300, seen="1:2:300:9"
    )
    alone = old_cursor.objects.create(path="/c/y.jsonl", tag="cccc", file_id="3:4", offset=50)
    never = old_cursor.objects.create(path="/d/z.jsonl", tag="dddd", file_id="", offset=0)
    old_cursor.objects.filter(pk=behind.pk).update(seen="1:2:100:8", lines_imported=7)

    migrate(AFTER)

    names = {name.path: (name.cursor_id, name.seen) for name in IngestPath.objects.all()}
    assert names == {
        "/a/x.jsonl": (ahead.pk, "1:2:100:8"),  # points at the cursor that got furthest
        "/b/x.jsonl": (ahead.pk, "1:2:300:9"),
        "/c/y.jsonl": (alone.pk, ""),
        "/d/z.jsonl": (never.pk, ""),
    }
    cursors = {c.pk: c for c in IngestCursor.objects.all()}
    assert len(cursors) == 4  # nothing deleted: counts and tags stay
    assert (cursors[behind.pk].file_id, cursors[behind.pk].lines_imported) == ("", 7)
    assert (cursors[ahead.pk].file_id, cursors[ahead.pk].tag, cursors[ahead.pk].offset) == (
        "1:2",
        "bbbb",
        300,
    )
    assert sql.missing(connection) == []  # the table copy on SQLite kept its triggers

    # And back: one cursor per path again, every path unique.
    back = migrate(BEFORE).get_model("recovery", "IngestCursor")
    paths = dict(back.objects.values_list("pk", "path"))
    assert paths[ahead.pk] == "/a/x.jsonl"  # the first name of the file takes its cursor
    assert paths[behind.pk] == f"/a/x.jsonl (cursor {behind.pk})"
    assert (paths[alone.pk], paths[never.pk]) == ("/c/y.jsonl", "/d/z.jsonl")
    assert back.objects.get(pk=ahead.pk).seen == "1:2:100:8"
