"""Nothing of the old README is lost: each of its headings is a heading of the page the map names.

docs/README-MAP.md lists every heading README.md had before the manual moved into
docs/ (issue 15). Renaming or dropping one of those sections on its page, or moving
it without updating the map, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
ROW = re.compile(r"^\| (#{1,6}) (?P<heading>.+?) \| \[(?P<page>[^\]]+)\]\((?P<link>[^)]+)\) \|$")


def map_rows() -> list[tuple[str, str]]:
    rows = []
    for line in (DOCS / "README-MAP.md").read_text(encoding="utf-8").splitlines():
        if match := ROW.match(line):
            rows.append((match["heading"].replace("\\|", "|"), match["page"]))
    return rows


def page_headings(page: Path) -> set[str]:
    """The page's Markdown headings, outside fenced code blocks."""
    headings, fence = set(), None
    for line in page.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if marker := re.match(r"(`{3,}|~{3,}|:{3,})", stripped):
            if fence is None:
                fence = marker.group(1)
            elif stripped == fence:
                fence = None
            continue
        if fence is None and (match := re.match(r"#{1,6} (.+)", line)):
            headings.add(match.group(1).strip())
    return headings


def test_the_map_lists_every_heading_of_the_old_readme() -> None:
    # The README of main before issue 15 had 37 headings (1 title, 17 sections, 19
    # subsections); a row lost from the map would hide a lost section.
    rows = map_rows()
    assert len(rows) == 37
    assert len({heading for heading, _ in rows}) == 37


@pytest.mark.parametrize(("heading", "page"), map_rows())
def test_each_old_readme_heading_is_on_its_page(heading: str, page: str) -> None:
    path = DOCS / page
    assert path.exists(), f"{page} (named in README-MAP.md for {heading!r}) does not exist"
    assert heading in page_headings(path), f"{heading!r} is no longer a heading of {page}"


README = DOCS.parent / "README.md"


def test_the_readme_is_short_and_its_links_lead_somewhere() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert len(local) >= 15  # the links into the docs, and the screenshot
    for link in local:
        path = (README.parent / link.split("#", 1)[0]).resolve()
        assert path.is_file(), f"README.md links to {link}, which does not exist"
