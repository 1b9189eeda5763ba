"""Check every internal link of the built HTML site: the page exists and so does its anchor.

Sphinx with -W already refuses a cross-reference it cannot resolve; this catches what
it lets through (a raw HTML link, a Markdown link to a heading that was renamed, a
download). External links are not fetched: the docs build needs no network.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for key in ("id", "name"):
            if values.get(key):
                self.ids.add(values[key])
        for key in ("href", "src"):
            if tag in {"a", "img", "link", "script"} and values.get(key):
                self.links.append(values[key])


def check(site: Path) -> list[str]:
    """Return one message per broken internal link of the site built under ``site``."""
    pages: dict[Path, _Page] = {}
    for path in sorted(site.rglob("*.html")):
        parser = _Page()
        parser.feed(path.read_text(encoding="utf-8"))
        pages[path.resolve()] = parser
    problems = []
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            where = f"{path.relative_to(site.resolve())}: {link}"
            if not target.exists():
                problems.append(f"{where}: no such file")
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html" and fragment not in pages[target].ids:
                problems.append(f"{where}: no anchor #{fragment}")
    return problems


def main() -> int:
    site = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/_build/html")
    if not (site / "index.html").exists():
        print(f"check_links: {site} holds no built site", file=sys.stderr)
        return 2
    problems = check(site)
    for problem in problems:
        print(f"broken link: {problem}", file=sys.stderr)
    count = sum(1 for _ in site.rglob("*.html"))
    print(f"check_links: {count} pages, {len(problems)} broken internal link(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
