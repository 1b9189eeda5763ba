"""One ingest cursor per file (device:inode), names of the file apart; a non-empty event type.

Before, a cursor belonged to a spelling of the path: the same file under two
names (a symlinked directory, a hard link, a bind mount) was imported twice.
Now ``IngestCursor`` follows a file and ``IngestPath`` records each name and
the file it held at the last look.

The data step gives every existing cursor its name (and what the heartbeat
last saw); cursors of one file under several names are merged into the one
that got furthest — the others keep their counts but no file, and their names
point at the survivor. Line identities already imported are unchanged.

``recovery_event_type_not_empty``: on SQLite adding a check constraint copies
the events table, which drops the dashboard's triggers, so they are installed
again at the end (``recovery.dashboard.sql.install`` is idempotent; on SQLite
the search index catches up by its own job).
"""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


def names_from_cursors(apps, schema_editor):
    cursor_model = apps.get_model("recovery", "IngestCursor")
    path_model = apps.get_model("recovery", "IngestPath")
    using = schema_editor.connection.alias
    cursors = list(cursor_model.objects.using(using).order_by("id"))
    survivors = {}  # file_id -> the cursor that got furthest in that file
    for cursor in cursors:
        if not cursor.file_id:
            continue
        best = survivors.get(cursor.file_id)
        if best is None or (cursor.offset, -cursor.id) > (best.offset, -best.id):
            survivors[cursor.file_id] = cursor
    for cursor in cursors:
        survivor = survivors.get(cursor.file_id, cursor) if cursor.file_id else cursor
        if survivor.pk != cursor.pk:
            cursor_model.objects.using(using).filter(pk=cursor.pk).update(file_id="")
        path_model.objects.using(using).create(
            path=cursor.path, cursor_id=survivor.pk, seen=cursor.seen
        )
    if schema_editor.connection.vendor == "postgresql":
        # The next steps alter tables with rows just written under deferred checks.
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def cursors_from_names(apps, schema_editor):
    """Back to one cursor per path: each name's file keeps its cursor under that name.

    A cursor no name points at keeps its place under a path marked with its id
    (the path must be unique again); a second name of one file gets none, so
    the older code imports it again under that name — its known limitation.
    """
    cursor_model = apps.get_model("recovery", "IngestCursor")
    path_model = apps.get_model("recovery", "IngestPath")
    using = schema_editor.connection.alias
    named = {}
    for name in path_model.objects.using(using).exclude(cursor=None).order_by("id"):
        if name.cursor_id not in named:
            named[name.cursor_id] = name.path
            cursor_model.objects.using(using).filter(pk=name.cursor_id).update(
                path=name.path, seen=name.seen
            )
    used = set(named.values())
    for cursor in cursor_model.objects.using(using).order_by("id"):
        if cursor.pk not in named and cursor.path in used:
            cursor.path = f"{cursor.path[:1000]} (cursor {cursor.pk})"
            cursor.save(update_fields=["path"])
        used.add(cursor.path)


def name_empty_types(apps, schema_editor):
    """The constraint below would refuse a row the parser should never have let through."""
    event_model = apps.get_model("recovery", "RecoveryEvent")
    event_model.objects.using(schema_editor.connection.alias).filter(type="").update(type="(empty)")


def reinstall_dashboard_sql(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return  # PostgreSQL adds the constraint in place: its triggers stay
    from recovery.dashboard import sql

    sql.install_in_migration(apps, schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0003_dashboard"),
    ]

    operations = [
        migrations.CreateModel(
            name="IngestPath",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("path", models.CharField(max_length=1024, unique=True)),
                (
                    "cursor",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="names",
                        to="recovery.ingestcursor",
                    ),
                ),
                (
                    "seen",
                    models.CharField(
                        blank=True, default="", help_text="Last looked at.", max_length=128
                    ),
                ),
                ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
        ),
        migrations.AlterField(
            model_name="ingestcursor",
            name="path",
            field=models.CharField(help_text="The name it was last read under.", max_length=1024),
        ),
        migrations.RunPython(names_from_cursors, cursors_from_names),
        migrations.RemoveField(
            model_name="ingestcursor",
            name="seen",
        ),
        migrations.AddConstraint(
            model_name="ingestcursor",
            constraint=models.UniqueConstraint(
                condition=models.Q(("file_id", ""), _negated=True),
                fields=("file_id",),
                name="recovery_ingest_file_unique",
            ),
        ),
        migrations.RunPython(name_empty_types, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="recoveryevent",
            constraint=models.CheckConstraint(
                condition=models.Q(("type", ""), _negated=True),
                name="recovery_event_type_not_empty",
            ),
        ),
        migrations.RunPython(reinstall_dashboard_sql, migrations.RunPython.noop),
    ]
