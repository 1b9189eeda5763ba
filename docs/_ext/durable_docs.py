"""Our Sphinx extension: reference pages generated from the code (filled in below)."""

from pygments.lexers.special import TextLexer
from sphinx.application import Sphinx


def setup(app: Sphinx) -> dict:
    # Pygments has no CSV lexer; the CSV examples are shown as plain text.
    app.add_lexer("csv", TextLexer)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
