"""Query strings, search patterns and paging of the table pages, as pure functions.

Everything a browser can put in a URL passes through here before it reaches a
query: garbage gives the default (``page=abc`` is page 1, ``per_page=-5`` is 10),
numbers too large are clamped, an unknown filter value is "all". Nothing here
raises on user input, so no query string can produce a 500.

Search is a *literal*, case-insensitive substring: the user's text becomes a
``LIKE`` pattern with ``%``, ``_`` and the escape character escaped, or an FTS5
phrase with its quotes doubled — never a regular expression and never SQL.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlencode

PER_PAGE_DEFAULT = 10
PER_PAGE_MAX = 100
PAGE_MAX = 10**9  # any larger page number is "the last page" anyway
MAX_QUERY_CHARS = 200
LIKE_ESCAPE = "\\"
# Trigram indexes (SQLite FTS5 ``trigram``, PostgreSQL ``pg_trgm``) need at
# least three characters; shorter searches scan a bounded number of rows.
MIN_INDEXED_CHARS = 3


# --- single values ------------------------------------------------------------------------


def parse_int(value: object, *, default: int, low: int, high: int) -> int:
    """A whole number from a query-string value.

    Not a plain decimal number (``abc``, ``1.5``, ``-1``, ``1e3``, empty) → ``default``;
    below ``low`` → ``default``; above ``high`` → ``high`` (so ``page=10**30``
    asks for the last page rather than for nothing).
    """
    if not isinstance(value, str):
        return default
    text = value.strip()
    if not text.isascii() or not text.isdigit():
        return default
    if len(text) > 18:  # far beyond any limit we use; avoids building huge ints
        return high
    number = int(text)
    if number < low:
        return default
    return min(number, high)


def parse_choice(value: object, choices: Sequence[str], default: str) -> str:
    """``value`` if it is one of ``choices`` (exactly, after trimming), else ``default``."""
    if isinstance(value, str) and value.strip() in choices:
        return value.strip()
    return default


def clean_query(value: object, limit: int = MAX_QUERY_CHARS) -> str:
    """Search text as typed, minus what no database column can match.

    Control characters (NUL above all: PostgreSQL refuses it in a parameter)
    are dropped, surrounding whitespace trimmed, the length capped.
    """
    if not isinstance(value, str):
        return ""
    text = "".join(
        ch for ch in value if ch in " \t" or unicodedata.category(ch) not in ("Cc", "Cs")
    )
    text = text.replace("\t", " ").strip()
    return text[:limit].strip()


# --- a table page's query ---------------------------------------------------------------------


@dataclass(frozen=True)
class Filter:
    """One filter of a table page: its query-string name, its values, its default."""

    name: str
    choices: tuple[str, ...] = ()  # empty: free text (cleaned like the search)
    default: str = ""


@dataclass(frozen=True)
class TableQuery:
    """What a table page shows: search, filters, page and page size.

    ``params()`` renders it back as a query string with defaults left out, so
    links stay short and equal pages have equal URLs.
    """

    q: str = ""
    page: int = 1
    per_page: int = PER_PAGE_DEFAULT
    filters: tuple[tuple[str, str], ...] = ()
    defaults: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def get(self, name: str) -> str:
        return dict(self.filters).get(name, "")

    def __getitem__(self, name: str) -> str:
        """Filters by name in templates: ``{{ query.status }}``."""
        filters = dict(self.filters)
        if name not in filters:
            raise KeyError(name)
        return filters[name]

    def with_(self, **changes: object) -> TableQuery:
        """A copy with ``q``/``page``/``per_page`` or filter values changed."""
        own: dict[str, Any] = {k: v for k, v in changes.items() if k in ("q", "page", "per_page")}
        filters = dict(self.filters)
        for name, value in changes.items():
            if name not in own:
                filters[name] = str(value)
        changed = replace(self, **own, filters=tuple(filters.items()))
        if "page" not in own and (set(changes) - {"page"}):
            changed = replace(changed, page=1)  # a new search or filter starts at page 1
        return changed

    def params(self, **changes: object) -> str:
        query = self.with_(**changes) if changes else self
        defaults = dict(self.defaults)
        pairs: list[tuple[str, str]] = []
        if query.q:
            pairs.append(("q", query.q))
        for name, value in query.filters:
            if value and value != defaults.get(name, ""):
                pairs.append((name, value))
        if query.per_page != PER_PAGE_DEFAULT:
            pairs.append(("per_page", str(query.per_page)))
        if query.page != 1:
            pairs.append(("page", str(query.page)))
        return urlencode(pairs)


def parse_table_query(get: Mapping[str, object], filters: Sequence[Filter] = ()) -> TableQuery:
    """Parse ``?q=&page=&per_page=&<filter>=`` forgivingly (see ``parse_int``)."""
    values: list[tuple[str, str]] = []
    for spec in filters:
        raw = get.get(spec.name)
        if spec.choices:
            values.append((spec.name, parse_choice(raw, spec.choices, spec.default)))
        else:
            values.append((spec.name, clean_query(raw, 200) or spec.default))
    return TableQuery(
        q=clean_query(get.get("q")),
        page=parse_int(get.get("page"), default=1, low=1, high=PAGE_MAX),
        per_page=parse_int(get.get("per_page"), default=PER_PAGE_DEFAULT, low=1, high=PER_PAGE_MAX),
        filters=tuple(values),
        defaults=tuple((spec.name, spec.default) for spec in filters),
    )


# --- search patterns ----------------------------------------------------------------------


def like_contains(text: str) -> str:
    """A ``LIKE … ESCAPE '\\'`` pattern matching ``text`` literally anywhere.

    ``\\`` first, so the escapes added for ``%`` and ``_`` are not escaped again.
    """
    escaped = (
        text.replace(LIKE_ESCAPE, LIKE_ESCAPE * 2)
        .replace("%", LIKE_ESCAPE + "%")
        .replace("_", LIKE_ESCAPE + "_")
    )
    return f"%{escaped}%"


def fts5_phrase(text: str) -> str:
    """An FTS5 query matching ``text`` as one phrase: quoted, inner quotes doubled.

    With the ``trigram`` tokenizer a phrase matches exactly the rows that
    contain ``text`` as a (case-folded) substring; nothing inside the quotes is
    FTS5 syntax (``AND``, ``*``, ``NEAR``, ``^`` are plain characters there).
    """
    return '"' + text.replace('"', '""') + '"'


def uses_index(text: str) -> bool:
    """Long enough for a trigram index (three characters)."""
    return len(text) >= MIN_INDEXED_CHARS


# --- paging -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """Which rows of a newest-first list a page shows, and how to read them cheaply.

    ``offset`` rows come before the page and ``after`` rows after it. When
    ``from_end`` is set the page is nearer the oldest end: read ``limit`` rows
    in *ascending* order skipping ``after`` and reverse them, so the last page
    of a million rows costs what the first one does. ``bounded``: ``total`` is
    only a lower bound (the count stopped at a cap); such a list is read from
    the newest end and ends at the cap.
    """

    number: int
    pages: int
    per_page: int
    total: int
    offset: int
    limit: int
    after: int
    from_end: bool
    bounded: bool = False

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_next(self) -> bool:
        return self.number < self.pages

    @property
    def first_row(self) -> int:
        """1-based position of the page's first row (0 when empty)."""
        return self.offset + 1 if self.limit else 0

    @property
    def last_row(self) -> int:
        return self.offset + self.limit


def window(requested: int, per_page: int, total: int, *, bounded: bool = False) -> Window:
    """The page ``requested`` of ``total`` rows, clamped into ``1…pages``.

    An empty list still has one (empty) page, so "page 1 / 1" is always true.
    """
    per_page = max(1, per_page)
    total = max(0, total)
    pages = max(1, math.ceil(total / per_page))
    number = min(max(1, requested), pages)
    offset = (number - 1) * per_page
    limit = max(0, min(per_page, total - offset))
    after = max(0, total - offset - limit)
    from_end = not bounded and after < offset
    return Window(number, pages, per_page, total, offset, limit, after, from_end, bounded)
