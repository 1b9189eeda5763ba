"""Pure parts of the database operations: value encoding, the table digest, the load order."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from decimal import Decimal

import pytest
from django.db import models
from django.test.utils import isolate_apps

from durable.builtin.tables import (
    PlanError,
    TableDigest,
    TableError,
    decode_value,
    encode_value,
    plan_order,
    row_bytes,
    spec_for,
    units_for,
)

UTC = dt.UTC


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (models.CharField(), "ünïcødé ✓ \x01 \n"),
        (models.IntegerField(), -(2**31)),
        (models.BigIntegerField(), 2**63 - 1),
        (models.FloatField(), 0.1),
        (models.FloatField(), -0.0),
        (models.DecimalField(max_digits=12, decimal_places=2), Decimal("1234567890.12")),
        (models.DecimalField(max_digits=5, decimal_places=2), Decimal("-0.50")),
        (models.BooleanField(), False),
        (models.DateTimeField(), dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)),
        (models.DateField(), dt.date(1999, 12, 31)),
        (models.TimeField(), dt.time(23, 59, 59, 999999)),
        (models.DurationField(), dt.timedelta(days=-3, seconds=5, microseconds=7)),
        (models.DurationField(), dt.timedelta(days=400, microseconds=1)),
        (models.UUIDField(), uuid.UUID("12345678-1234-5678-1234-567812345678")),
        (models.BinaryField(), bytes(range(256))),
        (models.JSONField(), {"b": [1, 2.5, None, True], "a": {"é": "x"}}),
        (models.JSONField(), "just a string"),
        (models.JSONField(), [1, "two"]),
        (models.GenericIPAddressField(), "2001:db8::1"),
    ],
)
def test_encode_value__round_trips_through_the_fields_to_python(field, value):
    encoded = encode_value(value)
    row_bytes([encoded])  # plain JSON: would raise otherwise
    assert decode_value(field, encoded) == value


def test_encode_value__binary_from_postgresql_memoryview_equals_bytes():
    assert encode_value(memoryview(b"\x00\xff")) == encode_value(b"\x00\xff")


@pytest.mark.parametrize("value", [math.inf, -math.inf])
def test_encode_value__non_finite_floats_survive_json(value):
    assert decode_value(models.FloatField(), encode_value(value)) == value


def test_encode_value__nan_survives_json():
    assert math.isnan(decode_value(models.FloatField(), encode_value(math.nan)))


def test_decode_value__null_stays_null_for_every_field():
    assert decode_value(models.DateTimeField(), None) is None
    assert decode_value(models.JSONField(), None) is None


def test_row_bytes__object_key_order_does_not_matter():
    # PostgreSQL's jsonb returns keys in its own order; SQLite keeps the inserted order.
    assert row_bytes([1, {"b": 1, "a": 2}]) == row_bytes([1, {"a": 2, "b": 1}])


def test_row_bytes__distinguishes_values_that_print_alike():
    assert row_bytes([1, "1"]) != row_bytes([1, 1])
    assert row_bytes([None]) != row_bytes(["None"])


# --- the digest -----------------------------------------------------------------------


def digest(rows):
    d = TableDigest()
    for row in rows:
        d.add(row_bytes(row))
    return d


ROWS = [[1, "a", None], [2, "b", {"x": 1}], [3, "c", 2.5]]


def test_digest__is_independent_of_row_order():
    assert digest(ROWS) == digest(list(reversed(ROWS)))
    assert digest(ROWS).hexdigest() == digest([ROWS[1], ROWS[2], ROWS[0]]).hexdigest()


@pytest.mark.parametrize(
    "changed",
    [
        ROWS[:2],  # a row dropped
        [*ROWS, [4, "d", None]],  # a row added
        [[1, "a", None], [2, "b", {"x": 2}], [3, "c", 2.5]],  # a nested value changed
        [[1, "a", None], [2, "B", {"x": 1}], [3, "c", 2.5]],  # a text value changed
        [[1, "a", None], [2, "b", {"x": 1}], [3, "c", 2.50001]],  # a float changed
        [[1, "a", None], [2, "b", {"x": 1}], [3, "c", 2.5], [3, "c", 2.5]],  # a duplicate
    ],
)
def test_digest__changes_when_anything_changes(changed):
    assert digest(changed) != digest(ROWS)


def test_digest__of_parts_adds_up_to_the_digest_of_the_whole():
    # A backup computes one digest per part file and sums them into the table's.
    whole = digest(ROWS)
    first, second = digest(ROWS[:1]), digest(ROWS[1:])
    assert (first.total + second.total) % 2**256 == whole.total


def test_units_for__counts_batches():
    assert [units_for(rows, 10) for rows in (0, 1, 10, 11, 25)] == [0, 1, 1, 2, 3]


# --- the load order ---------------------------------------------------------------------


def fk(target, nullable=False):
    return (target, nullable)


@pytest.mark.parametrize(
    ("edges", "order", "deferred"),
    [
        # no foreign keys: by label
        ({"b.x": {}, "a.y": {}}, ("a.y", "b.x"), {}),
        # a child after its parent, whatever the labels say
        ({"a.child": {"p_id": fk("z.parent")}, "z.parent": {}}, ("z.parent", "a.child"), {}),
        # a chain
        (
            {"c": {"b_id": fk("b")}, "b": {"a_id": fk("a")}, "a": {}},
            ("a", "b", "c"),
            {},
        ),
        # a foreign key to a table outside the set imposes nothing
        ({"a": {"u_id": fk("auth.user")}}, ("a",), {}),
        # a nullable self-reference is deferred (second pass)
        ({"tree": {"parent_id": fk("tree", True)}}, ("tree",), {"tree": ("parent_id",)}),
        # a cycle through one nullable key: that key is deferred, the other orders them
        (
            {"a": {"b_id": fk("b", True)}, "b": {"a_id": fk("a")}},
            ("a", "b"),
            {"a": ("b_id",)},
        ),
        # a cycle of nullable keys: both deferred, members by label
        (
            {"b": {"a_id": fk("a", True)}, "a": {"b_id": fk("b", True)}, "c": {"a_id": fk("a")}},
            ("a", "b", "c"),
            {"a": ("b_id",), "b": ("a_id",)},
        ),
        # m2m through table after both ends
        (
            {"s.sample_tags": {"s_id": fk("s.sample"), "t_id": fk("s.tag")}, "s.sample": {},
             "s.tag": {}},
            ("s.sample", "s.tag", "s.sample_tags"),
            {},
        ),
    ],
)  # fmt: skip
def test_plan_order__parents_first_and_cycles_deferred(edges, order, deferred):
    plan = plan_order(edges)
    assert plan.order == order
    assert dict(plan.deferred) == deferred


def test_plan_order__a_non_nullable_self_reference_cannot_be_batched():
    with pytest.raises(PlanError, match=r"tree\.parent_id"):
        plan_order({"tree": {"parent_id": fk("tree")}})


def test_plan_order__a_cycle_of_non_nullable_keys_has_no_order():
    with pytest.raises(PlanError, match="a, b"):
        plan_order({"a": {"b_id": fk("b")}, "b": {"a_id": fk("a")}})


def test_plan_order__handles_long_chains_without_recursion_limits():
    edges = {f"t{n:04d}": {"up": fk(f"t{n - 1:04d}")} for n in range(1, 3000)}
    edges["t0000"] = {}
    assert plan_order(edges).order == tuple(f"t{n:04d}" for n in range(3000))


# --- which columns a table carries ---------------------------------------------------------


@isolate_apps("tests.opsapp")
def test_spec__carries_a_multi_table_child_s_own_columns_but_no_generated_ones():
    class Parent(models.Model):  # noqa: DJ008 - a throwaway model
        name = models.CharField(max_length=10)

        class Meta:
            app_label = "opsapp"

    class Child(Parent):  # noqa: DJ008 - a throwaway model
        size = models.IntegerField()
        double = models.GeneratedField(
            expression=models.F("size") * 2, output_field=models.IntegerField(), db_persist=True
        )

        class Meta:
            app_label = "opsapp"

    spec = spec_for(Child)
    assert spec.columns == ["parent_ptr_id", "size"]  # the parent's columns are its own table's
    assert spec.pk.attname == "parent_ptr_id"
    assert spec.foreign_keys() == {"parent_ptr_id": ("opsapp.parent", False)}


@isolate_apps("tests.opsapp")
def test_spec__refuses_a_composite_primary_key_by_name():
    class Pair(models.Model):  # noqa: DJ008 - a throwaway model
        pk = models.CompositePrimaryKey("a", "b")
        a = models.IntegerField()
        b = models.IntegerField()

        class Meta:
            app_label = "opsapp"

    with pytest.raises(TableError, match=r"opsapp\.pair has a composite primary key"):
        spec_for(Pair)
