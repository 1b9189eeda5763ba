"""The code examples of the README and the docs run, as written, against the real engine.

Every Python block on every page is either run by a test here (or by the test named
in RUN_BY) or this module fails: a new example must come with the test that keeps
it true. Every ``python manage.py …`` line of a shell block parses with that
command's own argument parser, so an example cannot name an option that does not
exist.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import re
import shlex
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import CommandError
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from durable import checks, conf, operations, tracing
from durable.http import client as http_client
from durable.jobs import enqueue
from durable.models import Job, UnitResult
from durable.operations import Operation, Unit, register
from tests import traces
from tests.integration.helpers import drain
from tests.integration.servers import HttpServer, Reply
from tests.opsapp.models import Sample

from .snippets import Block, all_blocks, find

HERE = "tests/docs/test_examples.py"
TASKS = "tests/docs/test_task_examples.py"
WHEEL = "tests/integration/test_wheel.py::test_the_wheel_in_a_fresh_site"
# (page, text that identifies the block) -> the test that runs it.
RUN_BY = {
    ("README.md", "class Greet"): f"{HERE}::test_readme_first_durable_job",
    (
        "docs/how-to/write-an-operation.md",
        "class ResizeImages",
    ): f"{HERE}::test_adding_an_operation",
    ("docs/how-to/write-an-operation.md", "job = enqueue("): f"{HERE}::test_adding_an_operation",
    ("docs/how-to/write-an-operation.md", "class ExportRows"): f"{HERE}::test_paced_operation",
    ("docs/how-to/outbound-http.md", "http.request(ctx"): f"{HERE}::test_outbound_http_example",
    (
        "docs/how-to/webhooks-and-mail.md",
        'publish("backup.failed"',
    ): f"{HERE}::test_publish_example",
    ("docs/how-to/webhooks-and-mail.md", "def verify_webhook"): (
        "tests/unit/test_notify_policy.py::"
        "test_readme_verification_example__accepts_our_signature_and_rejects_a_forgery"
    ),
    ("docs/explanation/recovery-and-security-events.md", "signals.send_on_commit("): (
        f"{HERE}::test_recovery_event_example"
    ),
    ("docs/tutorials/first-operation.md", "class CountWords"): f"{HERE}::test_tutorial_operation",
    (
        "docs/how-to/backup-and-restore.md",
        "register_derived(",
    ): f"{HERE}::test_register_derived_example",
    (
        "docs/how-to/write-a-django-task.md",
        '"BACKEND": "durable.tasks.DurableBackend"',
    ): f"{TASKS}::test_the_settings_example_configures_a_valid_backend",
    ("docs/how-to/write-a-django-task.md", "def send_invoice"): (
        f"{TASKS}::test_the_task_and_its_result_example"
    ),
    ("docs/how-to/write-a-django-task.md", "result = send_invoice.enqueue(42)"): (
        f"{TASKS}::test_the_task_and_its_result_example"
    ),
    ("docs/how-to/write-a-django-task.md", "transaction.on_commit(partial("): (
        f"{TASKS}::test_enqueue_on_commit_example"
    ),
    ("docs/how-to/monitor.md", "provider = TracerProvider("): f"{HERE}::test_tracing_example",
    ("docs/how-to/run-workers.md", "DURABLE_LISTEN_URL ="): f"{HERE}::test_pgbouncer_settings",
    ("docs/how-to/embed-in-your-site.md", "INSTALLED_APPS +="): WHEEL,
    ("docs/how-to/embed-in-your-site.md", "urlpatterns +="): WHEEL,
    ("docs/how-to/write-a-django-task.md", "def import_account"): (
        f"{TASKS}::test_durable_steps_example__a_retry_repeats_only_the_step_that_failed"
    ),
}


@pytest.fixture
def registry() -> Iterator[None]:
    """Operations an example registers are forgotten afterwards (other tests list them all)."""
    before = dict(operations._registry)
    yield
    operations._registry.clear()
    operations._registry.update(before)


def test_every_python_example_is_run_by_a_test() -> None:
    blocks = all_blocks("python")
    assert len(blocks) >= len(RUN_BY)
    for block in blocks:
        owners = [key for key in RUN_BY if key[0] == block.page and key[1] in block.code]
        assert len(owners) == 1, (
            f"{block.page}:{block.line}: a Python example no test runs; add it to RUN_BY "
            f"in {HERE} with the test that runs it"
        )
    for page, marker in RUN_BY:
        find(page, marker)  # each entry names exactly one block


def test_every_python_example_compiles() -> None:
    for block in all_blocks("python"):
        compile(block.code, f"{block.page}:{block.line}", "exec")


def _manage_lines(block: Block) -> Iterator[list[str]]:
    """Each ``python manage.py …`` command of a shell block, as argv after manage.py."""
    pending = ""
    lines: list[str] = []
    for line in block.code.splitlines():
        if lines and re.match(r"\s+\[", line):  # a synopsis wrapped onto an indented line
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    for line in lines:
        pending += line.rstrip("\\") + " " if line.rstrip().endswith("\\") else line
        if pending.rstrip().endswith("\\"):
            continue
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on on the next line
            pending += "\n"
            continue
        pending = ""
        for start in range(len(words) - 1):
            if words[start].endswith("python") and words[start + 1] == "manage.py":
                yield words[start + 2 :]


def manage_commands() -> list[tuple[str, list[str]]]:
    found = []
    for language in ("sh", "bash", "console"):
        for block in all_blocks(language):
            for argv in _manage_lines(block):
                found.append((f"{block.page}:{block.line}", argv))
    return found


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    known = set()
    for action in parser._actions:
        known.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                known |= _option_strings(sub)
    return known


@pytest.mark.parametrize(("where", "argv"), manage_commands(), ids=lambda value: str(value)[:60])
def test_every_manage_py_example_parses(where: str, argv: list[str]) -> None:
    name, *args = argv
    commands = get_commands()
    assert name in commands, f"{where}: no management command {name!r}"
    parser = load_command_class(commands[name], name).create_parser("manage.py", name)
    if any(arg.startswith("[") or arg in {"…", "...", "|"} for arg in args):
        # A synopsis ("runworker [--concurrency N] [--queue Q ...]"): every option it
        # names must be one the command has (its subcommands' included).
        known = _option_strings(parser)
        for arg in args:
            for option in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", arg):
                assert option in known, f"{where}: manage.py {name} has no option {option}"
        return
    try:
        parser.parse_args(args)
    except CommandError as exc:
        pytest.fail(f"{where}: manage.py {shlex.join(argv)}: {exc}")


def test_the_shell_examples_are_found() -> None:
    commands = {argv[0] for _, argv in manage_commands()}
    # Guards the parser above against finding nothing: these are all on the pages.
    assert {"runworker", "enqueue_job", "add_schedule", "credential", "backup_database"} <= commands


# --- the examples, run ---------------------------------------------------------------------


@pytest.mark.django_db
def test_readme_first_durable_job(registry: None) -> None:
    namespace = find("README.md", "class Greet").run(module="greetings.operations")
    operation = operations.get_operation("greetings.send")
    assert isinstance(operation, namespace["Greet"])

    # The README's shell line, run through the command (the worker's part is drain()).
    line = find("README.md", "enqueue_job greetings.send", language="sh").code
    argv = shlex.split(line, comments=True)[2:]
    assert "--wait" in argv
    call_command(*[arg for arg in argv if arg != "--wait"])
    job = Job.objects.get(operation="greetings.send")
    assert job.input == {"names": ["Ada", "Grace"]}
    assert drain(job.pk).state == "completed"
    results = UnitResult.objects.filter(job_id=job.pk).order_by("pk")
    assert [r.result for r in results] == [{"greeted": "Ada"}, {"greeted": "Grace"}]

    # After a crash after the first unit the checkpoint says {"next": 1}: only Grace is left.
    ctx = SimpleNamespace(checkpoint={"next": 1}, input={"names": ["Ada", "Grace"]})
    assert [u.payload for u in operation.units(ctx)] == ["Grace"]


@pytest.mark.django_db
def test_adding_an_operation(registry: None) -> None:
    resized: list[str] = []

    def resize(path: str) -> dict[str, Any]:
        resized.append(path)
        return {"resized": path}

    find("docs/how-to/write-an-operation.md", "class ResizeImages").run(
        {"resize": resize}, module="images.operations"
    )
    namespace = find("docs/how-to/write-an-operation.md", "job = enqueue(").run()
    job = namespace["job"]
    assert job.owner == "alice"
    assert drain(job.pk).state == "completed"
    assert resized == ["a.png"]
    assert UnitResult.objects.get(job_id=job.pk).result == {"resized": "a.png"}
    created = namespace["created"]  # enqueue_many: one job per input, in order
    assert [(j.input, j.owner, j.created) for j in created] == [
        ({"paths": ["b.png"]}, "alice", True),
        ({"paths": ["c.png"]}, "alice", True),
    ]
    for each in created:
        assert drain(each.pk).state == "completed"
    assert resized == ["a.png", "b.png", "c.png"]


@pytest.mark.django_db
def test_paced_operation(registry: None, settings: Any) -> None:
    """The pacing example: units small first, every row exported once, in order."""
    settings.DURABLE_UNIT_TARGET_SECONDS = 60.0  # steady growth: each unit doubles
    rows = [Sample.objects.create(name=f"row {n}").pk for n in range(100)]
    exported: list[tuple[int, int]] = []

    def export(after: int, upto: int) -> dict[str, int]:
        exported.append((after, upto))
        return {"rows": Sample.objects.filter(pk__gt=after, pk__lte=upto).count()}

    find("docs/how-to/write-an-operation.md", "class ExportRows").run(
        {"Row": Sample, "export": export,
         "remaining": lambda after: Sample.objects.filter(pk__gt=after).count()},
        module="rows.operations",
    )  # fmt: skip
    job = drain(enqueue("rows.export", {"batch_size": 32}).pk)
    assert job.state == "completed"
    counts = [upto_n - after_n for after_n, upto_n in exported]
    assert exported[0] == (0, rows[0])  # the first unit after the claim: one row (32 / 32)
    assert counts[:6] == [1, 2, 4, 8, 16, 32]  # doubled each time, up to the cap
    assert sum(counts) == 100  # every row once, the units end to end
    assert all(a[1] == b[0] for a, b in itertools.pairwise(exported))


@pytest.mark.django_db(transaction=True)  # durable.http refuses to run inside a transaction
def test_outbound_http_example(registry: None, settings: Any) -> None:
    server = HttpServer()
    try:
        server.reply(
            "/repos/acme/app/issues", Reply(body=json.dumps([{"id": 1}, {"id": 2}]).encode())
        )
        settings.DURABLE_HTTP_PROVIDERS = {
            "github": {"base_url": server.url(""), "allow_hosts": ["127.0.0.1"], "max_in_flight": 0}
        }
        example = find("docs/how-to/outbound-http.md", "http.request(ctx").run()

        @register
        class ListIssues(Operation):
            name = "docs.list-issues"

            def units(self, ctx: Any) -> Iterator[Unit]:
                yield Unit(key="page:2", checkpoint={"done": True})

            run_unit = example["run_unit"]

        job = enqueue("docs.list-issues", {})
        assert drain(job.pk).state == "completed"
        assert UnitResult.objects.get(job_id=job.pk).result == {"count": 2}
        (request,) = server.requests("/repos/acme/app/issues")
        assert request.path == "/repos/acme/app/issues?page=2"
    finally:
        with http_client._clients_lock:  # no pooled connection outlives the server
            for client in http_client._clients.values():
                client.close()
            http_client._clients.clear()
        server.close()


@pytest.mark.django_db
def test_publish_example() -> None:
    from durable.webhooks.models import Delivery, Endpoint, OutboundEvent

    Endpoint.objects.create(
        name="ops",
        url="https://hooks.example.com/in",
        secret_ref="hooks",
        event_filter=["backup.*"],
    )
    find("docs/how-to/webhooks-and-mail.md", 'publish("backup.failed"').run()
    event = OutboundEvent.objects.get()
    assert event.event_type == "backup.failed"
    assert Delivery.objects.filter(event=event).count() == 1


@pytest.mark.django_db
def test_recovery_event_example(django_capture_on_commit_callbacks: Any) -> None:
    from recovery.models import RecoveryEvent

    ctx = SimpleNamespace(job_id=7, operation="backup.database")
    with django_capture_on_commit_callbacks(execute=True):
        find("docs/explanation/recovery-and-security-events.md", "signals.send_on_commit(").run(
            {"ctx": ctx}
        )
    event = RecoveryEvent.objects.get(type="backup-created")
    assert event.db == "wekan"
    assert event.detail == "Backed up wekan.sqlite to backup/2026-11-30"


@pytest.mark.django_db
def test_tutorial_operation(registry: None, tmp_path: Any) -> None:
    find("docs/tutorials/first-operation.md", "class CountWords").run(module="wordcount.operations")
    (tmp_path / "a.txt").write_text("one two three")
    (tmp_path / "b.txt").write_text("four five")
    (tmp_path / "sub").mkdir()  # not a file: no unit
    job = enqueue("wordcount.count", {"directory": str(tmp_path), "pause": 0})
    assert drain(job.pk).state == "completed"
    results = [r.result for r in UnitResult.objects.filter(job_id=job.pk).order_by("pk")]
    assert results == [
        {"file": str(tmp_path / "a.txt"), "words": 3},
        {"file": str(tmp_path / "b.txt"), "words": 2},
    ]
    # The tutorial's point: after a crash the units start after the checkpoint.
    operation = operations.get_operation("wordcount.count")
    ctx = SimpleNamespace(checkpoint={"next": 1}, input={"directory": str(tmp_path)})
    assert [u.payload for u in operation.units(ctx)] == [str(tmp_path / "b.txt")]
    # A directory that is not there fails the job at once, with the reason.
    missing = enqueue("wordcount.count", {"directory": str(tmp_path / "nope")})
    failed = drain(missing.pk)
    assert failed.state == "failed"
    assert "is not a directory" in failed.reason


@pytest.mark.django_db
def test_launch_script_helper_feeds_the_ingest(tmp_path: Any, settings: Any) -> None:
    """The launch-script helper of the feed how-to, run by bash, writes lines the ingest takes."""
    import shutil
    import subprocess

    from recovery.models import RecoveryEvent

    bash = shutil.which("bash")
    if bash is None or shutil.which("jq") is None:
        pytest.skip("bash or jq is not installed")
    block = find("docs/how-to/feed-recovery-events.md", "recovery_event()", language="sh")
    helper = block.code.split("\nif sqlite3")[0]
    events = tmp_path / "recovery-events.jsonl"
    script = (
        f"{helper}\n"
        'recovery_event integrity-ok info "quick_check of \\"wekan\\" passed"\n'
        "recovery_event corruption-detected error 'board 7: bad page' false\n"
    )
    subprocess.run(
        [bash, "-euc", script],
        env={"PATH": "/usr/bin:/bin", "RECOVERY_EVENTS_FILE": str(events)},
        check=True,
    )
    settings.RECOVERY_EVENTS_FILE = str(events)
    call_command("ingest_recovery_events", stdout=io.StringIO())  # what --wait runs, run here
    assert drain(Job.objects.get(operation="recovery.ingest").pk).state == "completed"
    ok = RecoveryEvent.objects.get(type="integrity-ok")
    assert ok.detail == 'quick_check of "wekan" passed'
    assert ok.done is True
    bad = RecoveryEvent.objects.get(type="corruption-detected")
    assert (bad.severity, bad.done, bad.db) == ("error", False, "wekan")


def test_register_derived_example() -> None:
    """The page's declaration makes the engine skip the table and rebuild it after its source."""
    from durable.builtin import derived

    rebuilt: list[str] = []
    before = dict(derived._derived)
    try:
        find("docs/how-to/backup-and-restore.md", "register_derived(").run(
            {"rebuild_daily_sales": rebuilt.append}
        )
        assert "shop.dailysales" in derived.derived_labels()  # left out of backups and copies
        (group,) = [g for g in derived.rebuilds_after(["shop.order"]) if g.name == "shop.stats"]
        group.rebuild("default")
        assert rebuilt == ["default"]
        assert not [g for g in derived.rebuilds_after(["shop.customer"]) if g.name == "shop.stats"]
    finally:
        derived._derived.clear()
        derived._derived.update(before)


@pytest.mark.django_db(transaction=True)
def test_tracing_example() -> None:
    """The "Monitor it" provider set-up, as written, turns tracing on for the engine."""
    traces.uninstall()
    namespace: dict[str, Any] = {}
    try:
        namespace = find("docs/how-to/monitor.md", "provider = TracerProvider(").run()
        seen = InMemorySpanExporter()
        namespace["provider"].add_span_processor(SimpleSpanProcessor(seen))
        assert tracing.active()
        with trace.get_tracer("example").start_as_current_span("request"):
            job = enqueue("durable.noop", {})
        assert json.loads(Job.objects.get(pk=job.pk).trace_context)["traceparent"]
        assert drain(job.pk).state == "completed"
        assert traces.by_name(list(seen.get_finished_spans()), "run durable.noop")
    finally:
        if "provider" in namespace:
            namespace["provider"].shutdown()
        traces.uninstall()


def test_pgbouncer_settings() -> None:
    """The "Behind PgBouncer" settings pass the system checks; without the cursors line
    they would not (and tests/integration/test_pgbouncer.py runs workers so configured)."""
    namespace = find("docs/how-to/run-workers.md", "DURABLE_LISTEN_URL =").run()
    site = SimpleNamespace(
        BASE_DIR="/srv/app", **{k: v for k, v in namespace.items() if k.isupper()}
    )
    conf.apply_defaults(site, conf.DEFAULTS, conf.DERIVED)
    assert site.DURABLE_LISTEN_URL.startswith("postgres://")
    assert checks.settings_problems(site, tasks_framework=True) == []
    del site.DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"]
    found = checks.settings_problems(site, tasks_framework=True)
    assert [m.id for m in found] == ["durable.W001"]
