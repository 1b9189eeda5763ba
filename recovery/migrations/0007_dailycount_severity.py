"""Per-day counts by severity too, for ``recovery_events{severity,failed}`` on GET /metrics.

The counts are derived: ``recovery.dashboard.sql.install_in_migration`` recounts them
from the events and re-creates the triggers, which now carry the severity.
"""

from django.db import migrations, models


def reinstall_dashboard_sql(apps, schema_editor):
    from recovery.dashboard import sql

    sql.install_in_migration(apps, schema_editor)


def uninstall_dashboard_sql(apps, schema_editor):
    """Before the counts table changes, either way: SQLite copies the table to alter it,
    and a trigger naming it (or the column going away) fails that copy."""
    from recovery.dashboard import sql

    sql.uninstall(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0006_throughput_rollup"),
    ]

    operations = [
        migrations.RunPython(uninstall_dashboard_sql, reinstall_dashboard_sql),
        migrations.RemoveConstraint(model_name="dailycount", name="recovery_dailycount_unique"),
        migrations.AddField(
            model_name="dailycount",
            name="severity",
            field=models.CharField(default="info", max_length=7),
        ),
        migrations.AddConstraint(
            model_name="dailycount",
            constraint=models.UniqueConstraint(
                fields=("day", "failed", "deleted", "severity"), name="recovery_dailycount_unique"
            ),
        ),
        migrations.RunPython(reinstall_dashboard_sql, uninstall_dashboard_sql),
    ]
