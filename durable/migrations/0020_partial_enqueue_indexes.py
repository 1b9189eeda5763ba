"""Two indexes of durable_job skip the rows that can never match them (issue 23).

``durable_job_finished`` only holds finished jobs (every query of it bounds
``finished_at``), ``durable_job_unique_unfinished`` only jobs with a unique key:
a job enqueued without a key writes two index entries fewer. Queries keep their
plans (tests/integration/test_indexes.py).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable", "0019_metrics_reclaims"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="job",
            name="durable_job_unique_unfinished",
        ),
        migrations.RemoveIndex(
            model_name="job",
            name="durable_job_finished",
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)),
                fields=["finished_at", "state", "queue", "operation"],
                name="durable_job_finished",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    ("state__in", ["queued", "running", "paused", "cancelling"]),
                    ("unique_key__isnull", False),
                ),
                fields=("unique_key",),
                name="durable_job_unique_unfinished",
            ),
        ),
    ]
