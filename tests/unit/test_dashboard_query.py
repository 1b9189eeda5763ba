"""Query strings, search patterns and paging of the dashboard's table pages."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recovery.dashboard.query import (
    MAX_QUERY_CHARS,
    PAGE_MAX,
    PER_PAGE_DEFAULT,
    PER_PAGE_MAX,
    Filter,
    clean_query,
    fts5_phrase,
    like_contains,
    parse_choice,
    parse_int,
    parse_table_query,
    uses_index,
    window,
)

# --- numbers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("3", 3),  # plain
        (" 7 ", 7),  # surrounding blanks are fine
        ("0", 1),  # below the range: the default, not the bound
        ("-1", 1),  # a sign is not a digit
        ("abc", 1),  # garbage
        ("", 1),  # empty
        ("1.5", 1),  # not whole
        ("1e3", 1),  # no exponents
        ("٣", 1),  # Arabic-Indic digit: isdigit() but not ASCII
        ("+4", 1),  # no plus sign either
        (None, 1),  # missing
        (["2"], 1),  # not a string
        ("500", 100),  # above the range: clamped to the top
        (str(10**30), 100),  # huge: clamped without building a huge int
        ("99999999999999999999999999999999999999999", 100),
    ],
)  # fmt: skip
def test_parse_int(value, expected):
    assert parse_int(value, default=1, low=1, high=100) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("failed", "failed"),
        (" done ", "done"),  # trimmed
        ("FAILED", "all"),  # exact values only
        ("", "all"),
        (None, "all"),
        ("'; drop table x; --", "all"),
    ],
)
def test_parse_choice(value, expected):
    assert parse_choice(value, ("all", "done", "failed"), "all") == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("  backup  ", "backup"),  # trimmed
        ("a\x00b", "ab"),  # NUL: PostgreSQL refuses it in a parameter
        ("line\nbreak\r", "linebreak"),  # control characters dropped
        ("tab\there", "tab here"),  # a tab becomes a space
        ("\ud800x", "x"),  # a lone surrogate cannot be encoded
        ("École ÉTÉ", "École ÉTÉ"),  # letters stay as typed
        (".*+?^${}()|[]\\", ".*+?^${}()|[]\\"),  # metacharacters stay: they are literal later
        ("%_", "%_"),
        (None, ""),
        (42, ""),
    ],
)
def test_clean_query(value, expected):
    assert clean_query(value) == expected


def test_clean_query__is_capped():
    assert len(clean_query("x" * 10_000)) == MAX_QUERY_CHARS


# --- a table page's query ------------------------------------------------------------------------

FILTERS = (Filter("status", ("all", "done", "failed"), "all"), Filter("operation"))


def test_parse_table_query__garbage_gives_defaults():
    query = parse_table_query(
        {"page": "-1", "per_page": "abc", "status": "nope", "q": "\x00", "operation": "\x01"},
        FILTERS,
    )
    assert (query.page, query.per_page, query.q) == (1, PER_PAGE_DEFAULT, "")
    assert query.get("status") == "all"
    assert query.get("operation") == ""


def test_parse_table_query__bounds():
    query = parse_table_query({"page": str(10**30), "per_page": "1000"}, FILTERS)
    assert query.page == PAGE_MAX
    assert query.per_page == PER_PAGE_MAX


def test_params__leave_out_defaults_and_round_trip():
    query = parse_table_query(
        {"q": "a&b=c", "status": "failed", "page": "3", "per_page": "25"}, FILTERS
    )
    assert query.params() == "q=a%26b%3Dc&status=failed&per_page=25&page=3"
    from urllib.parse import parse_qsl

    again = parse_table_query(dict(parse_qsl(query.params())), FILTERS)
    assert again == query
    assert parse_table_query({}, FILTERS).params() == ""


def test_params__a_new_filter_or_search_starts_at_page_one():
    query = parse_table_query({"status": "done", "page": "4"}, FILTERS)
    assert query.params(page=5) == "status=done&page=5"
    assert query.params(status="failed") == "status=failed"  # page dropped
    assert query.params(q="x") == "q=x&status=done"
    assert query.params(per_page=50) == "status=done&per_page=50"


def test_getitem__filters_by_name_for_templates():
    query = parse_table_query({"status": "failed"}, FILTERS)
    assert query["status"] == "failed"
    with pytest.raises(KeyError):
        query["page"]  # not a filter: templates fall back to the attribute


# --- search patterns ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("backup", "%backup%"),
        ("100%", "%100\\%%"),  # % is literal
        ("a_b", "%a\\_b%"),  # so is _
        ("C:\\tmp", "%C:\\\\tmp%"),  # the escape character itself is doubled first
        ("\\%", "%\\\\\\%%"),  # both: backslash doubled, then % escaped
        (".*+?^${}()|[]", "%.*+?^${}()|[]%"),  # regex syntax means nothing to LIKE
    ],
)
def test_like_contains(text, pattern):
    assert like_contains(text) == pattern


def _like_matches(pattern: str, value: str) -> bool:
    """LIKE … ESCAPE '\\' as the databases define it, case-insensitively (the reference)."""
    regex, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 1
            regex.append(re.escape(pattern[i]))
        elif ch == "%":
            regex.append(".*")
        elif ch == "_":
            regex.append(".")
        else:
            regex.append(re.escape(ch))
        i += 1
    return re.fullmatch("".join(regex), value, re.DOTALL | re.IGNORECASE) is not None


@given(
    needle=st.text(alphabet="ab%_\\.*x", min_size=1, max_size=6),
    hay=st.text(alphabet="ab%_\\.*xAB", max_size=20),
)
def test_like_contains__matches_exactly_the_literal_substring(needle, hay):
    assert _like_matches(like_contains(needle), hay) == (needle.lower() in hay.lower())


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ("backup", '"backup"'),
        ('say "hi"', '"say ""hi"""'),  # quotes doubled, so the phrase cannot be closed early
        ("a OR b NEAR(c) *", '"a OR b NEAR(c) *"'),  # FTS5 syntax inside quotes is text
    ],
)
def test_fts5_phrase(text, phrase):
    assert fts5_phrase(text) == phrase


@pytest.mark.parametrize(("text", "indexed"), [("ab", False), ("abc", True), ("éé", False)])
def test_uses_index__three_characters_or_more(text, indexed):
    assert uses_index(text) is indexed


# --- paging -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "per_page", "total", "expected"),
    [
        # (number, pages, offset, limit, after, from_end)
        (1, 10, 0, (1, 1, 0, 0, 0, False)),  # empty list: one empty page
        (5, 10, 0, (1, 1, 0, 0, 0, False)),  # beyond it: still that page
        (1, 10, 35, (1, 4, 0, 10, 25, False)),  # first page, from the newest end
        (2, 10, 35, (2, 4, 10, 10, 15, False)),
        (3, 10, 35, (3, 4, 20, 10, 5, True)),  # nearer the oldest end: read from there
        (4, 10, 35, (4, 4, 30, 5, 0, True)),  # the last page is partial
        (99, 10, 35, (4, 4, 30, 5, 0, True)),  # past the end: the last page
        (0, 10, 35, (1, 4, 0, 10, 25, False)),  # before the start: the first
        (1, 10, 10, (1, 1, 0, 10, 0, False)),  # exactly one page
        (2, 10, 20, (2, 2, 10, 10, 0, True)),
        (100_000, 10, 1_000_000, (100_000, 100_000, 999_990, 10, 0, True)),  # a million rows
        (50_000, 10, 1_000_000, (50_000, 100_000, 499_990, 10, 500_000, False)),  # just before half
        (2, 10, 30, (2, 3, 10, 10, 10, False)),  # a tie: from the newest end
    ],
)  # fmt: skip
def test_window(requested, per_page, total, expected):
    win = window(requested, per_page, total)
    assert (win.number, win.pages, win.offset, win.limit, win.after, win.from_end) == expected
    assert win.offset + win.limit + win.after == total


def test_window__bounded_counts_are_read_from_the_newest_end():
    win = window(1000, 10, 10_000, bounded=True)
    assert (win.number, win.pages, win.offset, win.from_end) == (1000, 1000, 9990, False)
    assert win.has_next is False


def test_window__navigation():
    first, middle, last = window(1, 10, 30), window(2, 10, 30), window(3, 10, 30)
    assert (first.has_previous, first.has_next) == (False, True)
    assert (middle.has_previous, middle.has_next) == (True, True)
    assert (last.has_previous, last.has_next) == (True, False)
    assert (middle.first_row, middle.last_row) == (11, 20)
    assert window(1, 10, 0).first_row == 0


@given(
    requested=st.integers(min_value=-5, max_value=10**6),
    per_page=st.integers(min_value=1, max_value=100),
    total=st.integers(min_value=0, max_value=10**6),
)
def test_window__always_inside_the_list(requested, per_page, total):
    win = window(requested, per_page, total)
    assert 1 <= win.number <= win.pages
    assert 0 <= win.limit <= per_page
    assert win.offset + win.limit + win.after == total
    assert win.limit == min(per_page, total - win.offset) or total == 0
