"""Sphinx configuration: MyST Markdown, the Furo theme, and our own generators.

The build needs no network: every reference page is generated from the code in
this checkout (settings, management commands, the OpenAPI document, docstrings).
"""

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]

# The site's settings read the environment; a docs build must not create var/secret_key
# or depend on a database being reachable (nothing here opens a connection).
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recovery.settings")
os.environ.setdefault("SECRET_KEY", "docs-build-only-not-a-secret")

import django  # noqa: E402

django.setup()

project = "restart-safe"
author = "the restart-safe developers"
copyright = "2026, the restart-safe developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "durable_docs",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "reference/_generated"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]
suppress_warnings = []

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options: dict = {}

html_theme = "furo"
html_title = "restart-safe"
html_static_path = ["_static"]
