"""Reclaims counted in running totals, so the retention purge never lowers durable_reclaims.

The reclaims an installation already had before the totals' cursor are added once here;
those after it are counted live by the next scrape, as before.
"""

from django.db import migrations, models


def count_earlier_reclaims(apps, schema_editor):
    cursor = apps.get_model("durable", "MetricsCursor")
    upto = cursor.objects.filter(name="finished").values_list("upto", flat=True).first()
    if upto is None:
        return  # no scrape yet: the first one counts every reclaim from the beginning
    events = apps.get_model("durable", "JobEvent").objects.filter(
        kind="reclaimed", created_at__lt=upto
    )
    counts: dict[tuple[str, bool], int] = {}
    for operation, data in events.values_list("job__operation", "data").iterator():
        spent = (data or {}).get("attempt_spent", True) in (True, 1, "true", None)
        counts[(operation, spent)] = counts.get((operation, spent), 0) + 1
    total = apps.get_model("durable", "ReclaimTotal")
    total.objects.bulk_create(
        [total(operation=op, attempt_spent=spent, count=n) for (op, spent), n in counts.items()]
    )


class Migration(migrations.Migration):
    dependencies = [
        ("durable", "0018_gate_waits"),
    ]

    operations = [
        migrations.CreateModel(
            name="ReclaimTotal",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("operation", models.CharField(max_length=100)),
                ("attempt_spent", models.BooleanField()),
                ("count", models.PositiveBigIntegerField(default=0)),
            ],
            options={
                "db_table": "durable_metrics_reclaims",
            },
        ),
        migrations.RemoveIndex(
            model_name="jobevent",
            name="durable_jobevent_reclaims",
        ),
        migrations.AddIndex(
            model_name="jobevent",
            index=models.Index(
                condition=models.Q(("kind", "reclaimed")),
                fields=["created_at", "job_id"],
                name="durable_jobevent_reclaimed_at",
            ),
        ),
        migrations.AddConstraint(
            model_name="reclaimtotal",
            constraint=models.UniqueConstraint(
                fields=("operation", "attempt_spent"), name="durable_metrics_reclaims_unique"
            ),
        ),
        migrations.RunPython(count_earlier_reclaims, migrations.RunPython.noop),
    ]
