"""The API client scope metrics:read (GET /metrics): only the help text changes."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable", "0014_job_notify"),
    ]

    operations = [
        migrations.AlterField(
            model_name="client",
            name="scopes",
            field=models.JSONField(
                default=list,
                help_text=(
                    "Any of: jobs:read, jobs:write, jobs:admin, schedules:read, "
                    "schedules:write, metrics:read"
                ),
            ),
        ),
    ]
