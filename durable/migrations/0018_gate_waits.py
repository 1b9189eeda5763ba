"""Gate turn-aways counted on the gate row, for durable_http_gate_waits on GET /metrics."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable", "0017_job_trace_context"),
    ]

    operations = [
        migrations.AddField(
            model_name="providergate",
            name="wait_seconds",
            field=models.FloatField(db_default=0.0),
        ),
        migrations.AddField(
            model_name="providergate",
            name="waits_in_flight",
            field=models.PositiveBigIntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="providergate",
            name="waits_spacing",
            field=models.PositiveBigIntegerField(db_default=0),
        ),
    ]
