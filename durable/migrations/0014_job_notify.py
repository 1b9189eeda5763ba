"""PostgreSQL: NOTIFY durable_job '<queue>' whenever a job becomes due now (issue 12).

A trigger rather than a call in each code path: enqueue (one or many), retry,
resume, a schedule's occurrence, a release at shutdown all make a job queued
and due, and none of them can forget to wake the workers. The notification is
sent at commit, so a rolled-back enqueue wakes nobody, and PostgreSQL folds
identical notifications of one transaction into one (a bulk enqueue of 10,000
jobs into one queue is one wake-up). A job due later sends nothing: the
workers' poll timer starts it. Other databases: nothing to do.
"""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION durable_job_notify_row() RETURNS trigger AS $$
BEGIN
    IF NEW.next_attempt_at <= clock_timestamp() + interval '50 milliseconds' THEN
        PERFORM pg_notify('durable_job', NEW.queue);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION durable_job_notify_inserted() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('durable_job', queue) FROM (
        SELECT DISTINCT queue FROM inserted
        WHERE state = 'queued' AND next_attempt_at <= clock_timestamp() + interval '50 milliseconds'
    ) AS due;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER durable_job_notify_update
    AFTER UPDATE OF state, next_attempt_at ON durable_job
    FOR EACH ROW WHEN (NEW.state = 'queued')
    EXECUTE FUNCTION durable_job_notify_row();

CREATE TRIGGER durable_job_notify_insert
    AFTER INSERT ON durable_job REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION durable_job_notify_inserted();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS durable_job_notify_update ON durable_job;
DROP TRIGGER IF EXISTS durable_job_notify_insert ON durable_job;
DROP FUNCTION IF EXISTS durable_job_notify_row();
DROP FUNCTION IF EXISTS durable_job_notify_inserted();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):
    dependencies = [
        ("durable", "0013_console_indexes"),
    ]

    operations = [migrations.RunPython(forward, backward)]
