"""Our Sphinx extension: checks and reference pages generated from the code itself."""

from __future__ import annotations

import json
from pathlib import Path

import envscan
import generate
from pygments.lexers.special import TextLexer
from sphinx.application import Sphinx
from sphinx.util import logging

log = logging.getLogger(__name__)
SETTINGS_PAGE = "reference/settings"


def check_settings_reference(app: Sphinx, env: object) -> None:
    """Fail the build (a warning under -W) for each variable the code reads but the page omits."""
    page = Path(app.srcdir) / f"{SETTINGS_PAGE}.md"
    _, unresolved = envscan.scan()
    for where in unresolved:
        log.warning(
            "the code reads an environment variable or setting whose name the scan cannot "
            "work out, at %s; add it to envscan.DYNAMIC",
            where,
            location=SETTINGS_PAGE,
        )
    for read in envscan.missing(page.read_text(encoding="utf-8")):
        log.warning(
            "%s %s is read by the code (%s) but not documented on this page",
            read.kind,
            read.name,
            read.where,
            location=SETTINGS_PAGE,
        )


def write_generated(app: Sphinx) -> None:
    """Write the generated reference fragments before any page is read."""
    out = Path(app.srcdir) / "reference" / "_generated"
    out.mkdir(parents=True, exist_ok=True)
    document = generate.served_openapi()
    pages = {
        "commands.md": generate.commands_markdown(),
        "http-api.md": generate.openapi_markdown(document),
        "job-states.md": generate.job_states_markdown(),
        "openapi.json": json.dumps(document, indent=2, ensure_ascii=False) + "\n",
    }
    for name, text in pages.items():
        path = out / name
        # Rewriting an unchanged file would make Sphinx re-read every page that includes it.
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


def setup(app: Sphinx) -> dict:
    app.connect("builder-inited", write_generated)
    # Pygments has no CSV lexer; the CSV examples are shown as plain text.
    app.add_lexer("csv", TextLexer)
    app.connect("env-check-consistency", check_settings_reference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
