"""The field rules every way into the engine shares (durable.rules)."""

from __future__ import annotations

import pytest

from durable import rules


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (0, True),
        (-100, True),  # the lowest
        (100, True),  # the highest
        (101, False),  # one past the top
        (-101, False),  # one below the bottom
        (5.0, True),  # JSON's integral number
        (5.5, False),  # not a whole number
        (True, False),  # a bool is not a priority, although Python counts it as an int
        ("5", False),  # text is not a number here; enqueue() converts before it asks
        (None, False),
    ],
)
def test_priority_problem__accepts_exactly_the_integers_of_the_range(value, ok):
    assert (rules.priority_problem(value) is None) is ok


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (5, 5),
        ("5", 5),  # enqueue() has always read its argument with int()
        (5.0, 5),
        (-100, -100),
        (100, 100),
        (101, None),  # out of range, however it was written
        ("-101", None),
        ("high", None),  # not a number at all
        (None, None),
    ],
)
def test_priority_from__reads_what_code_passes_then_holds_it_to_the_range(value, expected):
    if expected is None:
        with pytest.raises(ValueError, match=r"from -100 to 100"):
            rules.priority_from(value)
    else:
        assert rules.priority_from(value) == expected


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("default", True),
        ("eu-west:low.2_b", True),  # every allowed punctuation mark
        ("a" * 64, True),  # as wide as the column
        ("a" * 65, False),  # one wider
        ("", False),
        ("-leading", False),  # must start with a letter or digit
        ("with space", False),
        ("ünïcode", False),  # ASCII only: names travel in URLs, logs and NOTIFY channels
        ("a/b", False),
        (7, False),
        (None, False),
    ],
)
def test_queue_name__one_pattern_for_every_caller(name, ok):
    assert rules.is_queue_name(name) is ok
    assert (rules.queue_name_problem(name) is None) is ok


def test_the_rules_match_the_columns_they_describe():
    from durable.models import Job

    assert Job._meta.get_field("queue").max_length == rules.QUEUE_NAME_MAX
    assert Job._meta.get_field("unique_key").max_length == rules.UNIQUE_KEY_MAX
