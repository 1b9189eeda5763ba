"""files.move's pure parts: unit keys, names, prefixes, overlapping roots, listing order."""

from __future__ import annotations

import errno
import os

import pytest
from django.core.files.storage import FileSystemStorage

from durable.builtin.files import (
    _access_error,
    clean_name,
    clean_prefix,
    is_temporary,
    iter_names,
    roots_overlap,
    temporary_name,
    unit_key,
)
from durable.errors import InputRejected, Unavailable


@pytest.mark.parametrize(
    ("name", "job", "expected"),
    [
        ("a.txt", 7, ".durable-move-7-"),  # beside the file, in its directory
        ("d/e/a.txt", 42, "d/e/.durable-move-42-"),
        ("d/" + "x" * 250, 1, "d/.durable-move-1-"),  # short whatever the name's length
    ],
)
def test_temporary_name__beside_the_file_tagged_with_the_job(name, job, expected):
    tmp = temporary_name(name, job)
    assert tmp.startswith(expected)
    assert tmp.endswith(".part")
    assert len(tmp.rpartition("/")[2]) < 64
    assert is_temporary(tmp)
    assert temporary_name(name, job) == tmp  # stable: a replay finds it again
    assert temporary_name(name, job + 1) != tmp  # another job's is another name
    assert temporary_name(name + "2", job) != tmp


@pytest.mark.parametrize(
    "name", ["a.part", ".durable-move-1-abc.part", "x.durable-move-1-0123456789abcdef.part",
             "durable-move-1-0123456789abcdef.part", ".durable-move-1-0123456789abcdef.part/x"],
)  # fmt: skip
def test_is_temporary__only_our_own_pattern(name):
    assert not is_temporary(name)


def test_iter_names__never_lists_temporary_names(tmp_path):
    for name in ("a.txt", temporary_name("a.txt", 3), f"d/{temporary_name('b', 3)}", "d/b"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    assert list(iter_names(FileSystemStorage(location=str(tmp_path)))) == ["a.txt", "d/b"]


def test_unit_key__the_name_or_a_digest_of_a_long_one():
    assert unit_key("a/b.txt") == "file:a/b.txt"
    long = "d/" * 200 + "x"
    assert unit_key(long).startswith("file-sha256:")
    assert len(unit_key(long)) <= 255
    assert unit_key(long) == unit_key(long)
    assert unit_key(long) != unit_key(long + "y")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("a/b.txt", "a/b.txt"),
        (" spaced name.txt ", "spaced name.txt"),
        ("dir\\file", "dir/file"),  # Windows separators
        ("ünïcødé/ß.bin", "ünïcødé/ß.bin"),
    ],
)
def test_clean_name__accepts(given, expected):
    assert clean_name(given, "names") == expected


@pytest.mark.parametrize(
    "given", ["", "   ", "../etc/passwd", "a/../../b", "/abs", "a\x00b", 5, "."]
)
def test_clean_name__refuses(given):
    with pytest.raises(InputRejected) as refused:
        clean_name(given, "names")
    assert refused.value.field == "names"


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, ""), ("", ""), ("reports/", "reports/"), (" 2024-", "2024-"), ("a\\b", "a/b")],
)
def test_clean_prefix__accepts(given, expected):
    assert clean_prefix(given) == expected


@pytest.mark.parametrize("given", ["/", "/srv", "../up", "a/../b", 7, "x\x00"])
def test_clean_prefix__refuses(given):
    with pytest.raises(InputRejected) as refused:
        clean_prefix(given)
    assert refused.value.field == "prefix"


@pytest.mark.parametrize(
    ("first", "second", "overlap"),
    [
        ("/srv/a", "/srv/b", False),
        ("/srv/a", "/srv/a/", True),  # the same directory
        ("/srv/a", "/srv/a/archive", True),  # the destination inside the source
        ("/srv/a/archive", "/srv/a", True),
        ("/srv/a", "/srv/ab", False),  # a common string prefix is not containment
    ],
)
def test_roots_overlap(first, second, overlap):
    assert roots_overlap(first, second) is overlap


def test_access_error__permission_and_full_disks_pause_others_are_retried():
    assert isinstance(_access_error(PermissionError(13, "denied"), "src:a"), Unavailable)
    full = _access_error(OSError(errno.ENOSPC, "full"), "dst:a")
    assert isinstance(full, Unavailable)
    assert "no space left" in str(full)
    io_error = OSError(errno.EIO, "I/O error")
    assert _access_error(io_error, "dst:a") is io_error


@pytest.fixture
def tree(tmp_path):
    names = ["a-c", "a/b", "a/z/1", "a0", "b.txt", "dir x/file ü", "a/y"]
    for name in names:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)
    return FileSystemStorage(location=tmp_path), sorted(names)


def test_iter_names__global_lexicographic_order(tree):
    storage, names = tree
    # "a-c" < "a/…" < "a0": a directory sorts where its contents do.
    assert list(iter_names(storage)) == names


@pytest.mark.parametrize(
    ("prefix", "after", "expected"),
    [
        ("", "a/y", ["a/z/1", "a0", "b.txt", "dir x/file ü"]),
        ("", "a/z/1", ["a0", "b.txt", "dir x/file ü"]),  # the whole of a/ is done
        ("a/", "", ["a/b", "a/y", "a/z/1"]),
        ("a", "", ["a-c", "a/b", "a/y", "a/z/1", "a0"]),  # a prefix, not a directory
        ("a/z", "", ["a/z/1"]),
        ("dir x/", "", ["dir x/file ü"]),
        ("nothing/", "", []),
        ("", "zzz", []),
    ],
)
def test_iter_names__prefix_and_after(tree, prefix, after, expected):
    storage, _ = tree
    assert list(iter_names(storage, prefix, after)) == expected


def test_iter_names__does_not_follow_directory_symlinks(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_text("x")
    os.symlink(tmp_path / "real", tmp_path / "loop")
    os.symlink(tmp_path, tmp_path / "real" / "up")  # a cycle, if followed
    assert list(iter_names(FileSystemStorage(location=tmp_path))) == ["real/f"]


def test_move__has_no_unit_timeout_a_large_file_would_never_finish_under():
    # unit_timeout ends the worker process once a unit overruns it (exit 70, the
    # attempt spent): one file per unit, a copy that takes longer could never succeed.
    from durable.operations import get_operation

    assert get_operation("files.move").unit_timeout is None
