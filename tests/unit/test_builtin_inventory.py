"""Pure parts of integrity scans: what a change means, the walk order, batching."""

from __future__ import annotations

import itertools

import pytest

from durable.builtin.inventory import (
    CORRUPTED,
    MODIFIED,
    NEW,
    OK,
    FileState,
    classify,
    clean_prefix,
    keys_after,
    severity,
    storable,
    take_batch,
)

BEFORE = FileState(size=10, sha256="a" * 64, mtime=1000.0)


@pytest.mark.parametrize(
    ("previous", "current", "status"),
    [
        # never seen
        (None, BEFORE, NEW),
        # same bytes
        (BEFORE, BEFORE, OK),
        # same bytes, touched: still ok (content is what matters)
        (BEFORE, FileState(10, "a" * 64, 2000.0), OK),
        # bytes changed, size and time did not: nothing wrote it
        (BEFORE, FileState(10, "b" * 64, 1000.0), CORRUPTED),
        # bytes changed and the time moved: a write
        (BEFORE, FileState(10, "b" * 64, 2000.0), MODIFIED),
        # size changed: a write (truncation keeps mtime only with tampering tools)
        (BEFORE, FileState(12, "b" * 64, 1000.0), MODIFIED),
        # the storage cannot tell times: a change is reported as a modification
        (FileState(10, "a" * 64, None), FileState(10, "b" * 64, None), MODIFIED),
    ],
)
def test_classify(previous, current, status):
    assert classify(previous, current) == status


@pytest.mark.parametrize(
    ("statuses", "level"),
    [
        ([], "info"),
        (["missing"], "warning"),
        (["modified", "missing"], "warning"),
        (["modified", "corrupted"], "error"),
        (["new", "ok"], "info"),
    ],
)
def test_severity__the_worst_finding_wins(statuses, level):
    assert severity(statuses) == level


TREE = {
    "": (["a", "b", "a-c"], ["z.txt", "0.txt"]),
    "a": (["x"], ["2", "10"]),
    "a/x": ([], ["deep"]),
    "a-c": ([], ["f"]),
    "b": ([], []),
}


def listdir(path):
    return TREE[path]


def test_keys_after__walks_in_component_order():
    # "a/..." sorts before "a-c" because the component "a" < "a-c",
    # although the string "a/" > "a-" (ord("/") > ord("-")).
    assert list(keys_after(listdir, "", None)) == [
        "0.txt", "a/10", "a/2", "a/x/deep", "a-c/f", "z.txt",
    ]  # fmt: skip


@pytest.mark.parametrize("position", range(6))
def test_keys_after__resumes_exactly_after_any_key(position):
    everything = list(keys_after(listdir, "", None))
    assert list(keys_after(listdir, "", everything[position])) == everything[position + 1 :]


def test_keys_after__does_not_descend_into_subtrees_before_the_resume_point():
    visited = []

    def spying(path):
        visited.append(path)
        return TREE[path]

    assert list(keys_after(spying, "", "a-c/f")) == ["z.txt"]
    assert "a" not in visited
    assert "a/x" not in visited


def test_keys_after__a_prefix_limits_the_walk():
    assert list(keys_after(listdir, "a", None)) == ["a/10", "a/2", "a/x/deep"]
    assert list(keys_after(listdir, "a", "a/2")) == ["a/x/deep"]


def test_take_batch__bounds_files_and_bytes_and_continues_where_it_stopped():
    keys = iter([f"k{n}" for n in range(7)])
    assert take_batch(keys, max_files=3, max_bytes=10_000) == ["k0", "k1", "k2"]
    assert take_batch(keys, max_files=3, max_bytes=10_000) == ["k3", "k4", "k5"]
    assert take_batch(keys, max_files=3, max_bytes=10_000) == ["k6"]
    assert take_batch(keys, max_files=3, max_bytes=10_000) == []
    long = iter(["x" * 100, "y" * 100, "z"])
    assert take_batch(long, max_files=50, max_bytes=150) == ["x" * 100, "y" * 100]


def test_take_batch__always_takes_at_least_one_key():
    assert take_batch(iter(["x" * 500]), max_files=10, max_bytes=10) == ["x" * 500]


def test_take_batch__does_not_consume_beyond_the_batch():
    keys = itertools.count()
    take_batch(map(str, keys), max_files=2, max_bytes=100)
    assert next(keys) == 2


@pytest.mark.parametrize(
    ("raw", "clean"),
    [("", ""), ("/media/", "media"), ("a//b/", "a/b"), ("  x ", "x")],
)
def test_clean_prefix(raw, clean):
    assert clean_prefix(raw) == clean


@pytest.mark.parametrize("raw", ["../etc", "a/../../b", "./a", "a\\b", "a\x00"])
def test_clean_prefix__refuses_escapes(raw):
    with pytest.raises(ValueError, match="relative path"):
        clean_prefix(raw)


def test_keys_after__a_link_loop_ends_at_the_depth_limit():
    def looping(path):  # "loop" links back to its parent: loop/loop/loop/...
        return (["loop"], ["f"])

    keys = list(keys_after(looping, "", None, max_depth=3))
    assert keys == ["f", "loop/f", "loop/loop/f", "loop/loop/loop/f"]


def test_storable__file_names_that_are_not_utf8_cannot_be_stored():
    assert storable("ünïcødé ✓.txt")
    assert not storable(b"caf\xe9.txt".decode("utf-8", "surrogateescape"))
