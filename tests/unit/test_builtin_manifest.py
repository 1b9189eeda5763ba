"""Pure parts of backups: the checksum list, the manifest, and what makes a backup unusable."""

from __future__ import annotations

import pytest

from durable.builtin.manifest import (
    FORMAT,
    build_manifest,
    format_sums,
    inventory_problems,
    is_excluded,
    manifest_files,
    parse_sums,
    part_name,
    reorder,
    restore_problems,
    shape_problems,
)

A = "a" * 64
B = "b" * 64
C = "c" * 64


def manifest(**overrides):
    built = build_manifest(
        job_id=7,
        database="default",
        vendor="sqlite",
        started_at="2026-01-01T00:00:00+00:00",
        finished_at="2026-01-01T00:01:00+00:00",
        consistency="per-batch",
        migrations={"auth": "0012_x", "admin": "0003_y"},
        tables=[
            {"model": "auth.user", "table": "auth_user", "columns": ["id", "username"],
             "pk": "id", "digest": "0" * 64},
            {"model": "auth.group", "table": "auth_group", "columns": ["id", "name"],
             "pk": "id", "digest": "1" * 64},
        ],
        parts={
            "auth.user": [
                {"file": part_name("auth.user", 0), "rows": 2, "bytes": 10, "sha256": A},
                {"file": part_name("auth.user", 1), "rows": 1, "bytes": 11, "sha256": B},
            ],
        },
    )  # fmt: skip
    built.update(overrides)
    return built


def test_sums__round_trip_in_sha256sum_format():
    text = format_sums({"z.txt": A, "manifest.json": B})
    assert text == f"{B}  manifest.json\n{A}  z.txt\n"
    assert parse_sums(text) == {"z.txt": A, "manifest.json": B}


def test_sums__accepts_binary_mode_marker_and_blank_lines():
    assert parse_sums(f"{A} *x.gz\n\n") == {"x.gz": A}


@pytest.mark.parametrize(
    "text",
    [
        "not a checksum line\n",
        f"{A[:-1]}  short.gz\n",  # 63 hex digits
        f"{A.upper()}  upper.gz\n",  # sha256sum writes lower case
        f"{A}  x.gz\n{B}  x.gz\n",  # listed twice
    ],
)
def test_sums__refuses_malformed_lists(text):
    with pytest.raises(ValueError, match="SHA256SUMS"):
        parse_sums(text)


def test_build_manifest__counts_rows_and_lists_every_table_even_empty_ones():
    built = manifest()
    assert built["format"] == FORMAT
    users, groups = built["tables"]
    assert users["rows"] == 3
    assert groups == {
        "model": "auth.group",
        "table": "auth_group",
        "columns": ["id", "name"],
        "pk": "id",
        "rows": 0,
        "digest": "1" * 64,
        "parts": [],
    }
    assert list(built["migrations"]) == ["admin", "auth"]
    assert manifest_files(built) == {
        "auth.user.000000.jsonl.gz": (10, A),
        "auth.user.000001.jsonl.gz": (11, B),
    }


def test_shape__a_good_manifest_has_no_problems():
    assert shape_problems(manifest()) == []


@pytest.mark.parametrize(
    ("broken", "problem"),
    [
        ([], "not a JSON object"),
        ({"format": "other/9"}, "unknown backup format"),
        ({"format": FORMAT}, "no table list"),
        ({"format": FORMAT, "tables": [{"model": "a.b"}]}, "malformed table entry"),
    ],
)
def test_shape__says_what_is_wrong(broken, problem):
    assert problem in shape_problems(broken)[0]


@pytest.mark.parametrize(
    ("file", "problem"),
    [
        ("../../etc/passwd", "unsafe"),
        ("/abs/path.jsonl.gz", "unsafe"),
        ("auth.group.000000.jsonl.gz", "belongs to another table"),
    ],
)
def test_shape__refuses_part_names_that_could_leave_the_directory(file, problem):
    bad = manifest()
    bad["tables"][0]["parts"][0]["file"] = file
    assert any(problem in p for p in shape_problems(bad))


def test_shape__refuses_a_table_listed_twice_or_without_its_key():
    bad = manifest()
    bad["tables"].append(dict(bad["tables"][0]))
    bad["tables"][1]["pk"] = "uuid"
    problems = shape_problems(bad)
    assert any("twice" in p for p in problems)
    assert any("primary key missing" in p for p in problems)


EXPECTED = {"p0": (10, A), "p1": (11, B)}


@pytest.mark.parametrize(
    ("sums", "actual", "problems"),
    [
        # all good
        ({"p0": A, "p1": B}, {"p0": (10, A), "p1": (11, B)}, []),
        # a file gone
        ({"p0": A, "p1": B}, {"p0": (10, A), "p1": None}, ["p1 is missing"]),
        # a flipped byte: same size, other hash
        ({"p0": A, "p1": B}, {"p0": (10, C), "p1": (11, B)},
         ["p0: SHA-256 mismatch (the file changed after it was written)"]),
        # truncated
        ({"p0": A, "p1": B}, {"p0": (9, C), "p1": (11, B)},
         ["p0: 9 bytes, the manifest recorded 10"]),
        # the two lists disagree
        ({"p0": C, "p1": B}, {"p0": (10, A), "p1": (11, B)},
         ["p0: the manifest and SHA256SUMS disagree on its SHA-256"]),
        # SHA256SUMS lacks a file / lists an extra one
        ({"p0": A}, {"p0": (10, A), "p1": (11, B)},
         ["p1 is in the manifest but not in SHA256SUMS"]),
        ({"p0": A, "p1": B, "x": C}, {"p0": (10, A), "p1": (11, B), "x": (1, C)},
         ["x is in SHA256SUMS but not in the manifest"]),
    ],
)  # fmt: skip
def test_inventory_problems__every_difference_is_named(sums, actual, problems):
    assert inventory_problems(EXPECTED, sums, actual) == problems


SITE = {"auth.user": ["id", "username"], "auth.group": ["id", "name"]}


def test_restore_problems__a_matching_site_has_none():
    assert restore_problems(manifest(), SITE) == []


def test_restore_problems__columns_may_come_in_another_order():
    assert restore_problems(manifest(), {**SITE, "auth.user": ["username", "id"]}) == []


def test_restore_problems__refuses_a_table_this_site_does_not_restore():
    problems = restore_problems(manifest(), {"auth.user": ["id", "username"]})
    assert problems == ["the backup has table auth.group, which this site does not restore"]


def test_restore_problems__refuses_different_columns():
    site = {**SITE, "auth.user": ["id", "username", "email"]}
    [problem] = restore_problems(manifest(), site)
    assert problem.startswith("auth.user: the backup's columns")
    assert "migrate" in problem


def test_restore_problems__excluded_tables_are_skipped_not_refused():
    assert restore_problems(manifest(), {"auth.user": ["id", "username"]}, {"auth.group"}) == []
    assert restore_problems(manifest(), {}, {"auth"}) == []


@pytest.mark.parametrize(
    ("label", "exclude", "expected"),
    [
        ("auth.user", {"auth"}, True),
        ("auth.user", {"auth.user"}, True),
        ("auth.user", {"auth.group"}, False),
        ("authx.user", {"auth"}, False),
    ],
)
def test_is_excluded(label, exclude, expected):
    assert is_excluded(label, exclude) is expected


def test_reorder__maps_columns_by_name():
    assert reorder([[1, "a", True]], ["id", "name", "flag"], ["flag", "id", "name"]) == [
        [True, 1, "a"]
    ]
    assert reorder([[1, 2]], ["a", "b"], ["a", "b"]) == [[1, 2]]
