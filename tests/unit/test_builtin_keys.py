"""Unique keys of the built-in operations that need no database."""

from __future__ import annotations

import pytest

from durable.builtin.inputs import MAX_UNIQUE_KEY, bounded_key
from recovery.imports.operations import ImportJsonl


@pytest.mark.parametrize(
    "key",
    [
        "import:/srv/x.jsonl",  # short: as it is
        "x" * MAX_UNIQUE_KEY,  # exactly the column: as it is
    ],
)
def test_bounded_key__a_key_that_fits_is_kept(key):
    assert bounded_key(key) == key


def test_bounded_key__a_long_key_fits_and_two_long_keys_stay_two():
    common = "import:/" + "d/" * 200
    first, second = bounded_key(common + "a.jsonl"), bounded_key(common + "b.jsonl")
    assert len(first) == len(second) == MAX_UNIQUE_KEY
    assert first != second
    assert first.startswith(common[:100])


def test_import_key__a_path_too_long_for_the_column_is_bounded_not_cut():
    op = ImportJsonl()
    deep = "/srv/imports/" + "d/" * 150
    first = op.unique_key({"path": deep + "a.jsonl"})
    second = op.unique_key({"path": deep + "b.jsonl"})
    assert len(first) <= MAX_UNIQUE_KEY
    assert first != second
    assert op.unique_key({"path": "/srv/imports/a.jsonl"}) == "import:/srv/imports/a.jsonl"
