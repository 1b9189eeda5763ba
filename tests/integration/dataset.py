"""A small data set with every awkward case the database operations must carry unchanged."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal
from typing import Any

from django.apps import apps
from django.contrib.auth.models import Group, User
from django.db import connections

from durable.builtin import backupdir
from durable.builtin.manifest import MANIFEST
from durable.builtin.tables import decode_value, site_tables, spec_for
from tests.opsapp.models import Node, Sample, Tag

# Tables the tests leave out of backups and restores: the event recorder must
# survive a restore that replaces tables, and the engine tests' side effects.
# Tables the operations' own reports write to while the tests run: excluded from
# the data the tests back up, restore, copy and compare.
TEST_EXCLUDE = ["opsapp.recordedevent", "testapp.sideeffect", "recovery"]


def make_dataset(alias: str = "default", samples: int = 12) -> None:
    users = [
        User.objects.db_manager(alias).create_user(f"user{n}", f"u{n}@example.com", "pw")
        for n in range(3)
    ]
    group = Group.objects.using(alias).create(name="operators")
    users[0].groups.add(group)
    tags = [
        Tag.objects.using(alias).create(code=code, title=f"tag {code}")
        for code in ("b-2", "a/1", "Z", "é", "a 0", "ü-long-" + "x" * 20)
    ]
    when = dt.datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=dt.UTC)
    for n in range(samples):
        sample = Sample.objects.using(alias).create(
            name=f"sample {n} — ünïcødé ✓",
            text="line\nbreak\ttab \"quote\" 'apostrophe' \\ backslash" * (n % 3),
            count=None if n % 4 == 0 else n * 7 - 20,
            big=2**62 - n,
            ratio=None if n % 5 == 0 else n / 3,
            price=None if n % 6 == 0 else Decimal(f"{n * 13}.{n:02d}"),
            flag=n % 2 == 0,
            when=when + dt.timedelta(days=n, microseconds=n),
            day=dt.date(2020, 1, 1) + dt.timedelta(days=n * 40),
            at=dt.time(n % 24, n, n, n * 1000),
            span=dt.timedelta(days=n, seconds=n * 3, microseconds=n),
            uid=uuid.UUID(int=n * 7919),
            blob=bytes(range(n, n + 16)) if n % 3 else None,
            data={"n": n, "b": [1, 2.5, None, True], "a": {"z": "é", "y": n}} if n % 2 else [n],
            ip="192.0.2.1" if n % 2 else "2001:db8::1",
            owner=users[n % 3] if n % 4 else None,
        )
        sample.tags.set(tags[: n % 4])
    # Children are created before their parents, so a child's parent has a
    # higher id: in primary-key batches the parent comes in a later batch.
    children = [Node.objects.using(alias).create(name=f"child {n}") for n in range(5)]
    parents = [Node.objects.using(alias).create(name=f"parent {n}") for n in range(3)]
    for n, child in enumerate(children):
        child.parent = parents[n % 3]
        child.save(using=alias)
    parents[1].parent = parents[2]
    parents[1].save(using=alias)
    Node.objects.using(alias).create(name="root without parent")


def contents(alias: str, exclude: list[str] | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every site table on ``alias``, straight from the ORM, sorted by primary key.

    Independent of the operations' own encoding: values are compared as the
    ORM returns them (binary normalised to bytes). Sorted in Python, because
    two databases may collate text keys differently.
    """
    found = {}
    for spec in site_tables(alias, exclude or TEST_EXCLUDE):
        rows = spec.model._base_manager.using(alias).values_list(*spec.columns)
        found[spec.label] = _sorted(spec, [_plain(row) for row in rows])
    return found


def backup_contents(path: Any) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of a published backup, decoded with each field's ``to_python``."""
    manifest = json.loads((path / MANIFEST).read_text())
    found = {}
    for table in manifest["tables"]:
        spec = spec_for(apps.get_model(table["model"]))
        by_name = {f.attname: f for f in spec.fields}
        rows = []
        for part in table["parts"]:
            for row in backupdir.read_part(path, part, table["columns"]):
                values = dict(zip(table["columns"], row, strict=True))
                rows.append(tuple(decode_value(by_name[c], values[c]) for c in spec.columns))
        found[table["model"]] = _sorted(spec, rows)
    return found


def _plain(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)


def _sorted(spec: Any, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    position = spec.columns.index(spec.pk.attname)
    return sorted(rows, key=lambda row: row[position])


def alias_url(alias: str) -> str:
    """The URL of ``alias``'s (test) database, for worker subprocesses."""
    settings = connections[alias].settings_dict
    if connections[alias].vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    user = settings.get("USER") or "postgres"
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    host = settings.get("HOST") or "127.0.0.1"
    port = settings.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{settings['NAME']}"


def model(label: str) -> Any:
    return apps.get_model(label)
