"""The code blocks in the docstrings the Python API page shows (autodoc) are valid Python.

They are rendered on docs/reference/python-api.md; running each against the engine
is the job of the tests of the module itself, but a block that does not even
compile is a docs bug this catches.
"""

from __future__ import annotations

import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "python-api.md"


def documented_modules() -> list[str]:
    text = PAGE.read_text(encoding="utf-8")
    return sorted(set(re.findall(r"\.\. auto(?:module|function|class):: ([\w.]+)", text)))


def literal_blocks(docstring: str) -> list[str]:
    """reST literal blocks: the indented lines after a paragraph ending in ``::``."""
    blocks, lines = [], docstring.expandtabs().splitlines()
    for index, line in enumerate(lines):
        if not line.rstrip().endswith("::"):
            continue
        base = len(line) - len(line.lstrip())
        body = []
        for following in lines[index + 1 :]:
            if following.strip() and len(following) - len(following.lstrip()) <= base:
                break
            body.append(following)
        code = textwrap.dedent("\n".join(body)).strip()
        if code:
            blocks.append(code)
    return blocks


def docstrings(name: str) -> list[tuple[str, str]]:
    module_name, _, attribute = name, "", None
    try:
        target = importlib.import_module(name)
    except ImportError:
        module_name, _, attribute = name.rpartition(".")
        target = getattr(importlib.import_module(module_name), attribute)
    found = [(name, inspect.getdoc(target) or "")]
    if inspect.ismodule(target):
        for member_name, member in vars(target).items():
            if getattr(member, "__module__", None) == target.__name__:
                found.append((f"{name}.{member_name}", inspect.getdoc(member) or ""))
    return found


def python_like(code: str) -> bool:
    # Shell sessions and tables in a docstring's literal blocks are not Python.
    return not code.startswith(("$", "|", "python manage.py", "curl"))


def test_the_page_documents_modules() -> None:
    assert {"durable.operations", "durable.jobs", "durable.errors"} <= set(documented_modules())


@pytest.mark.parametrize("name", documented_modules())
def test_docstring_code_blocks_compile(name: str) -> None:
    for where, doc in docstrings(name):
        for code in literal_blocks(doc):
            if python_like(code):
                compile(code, where, "exec")


def test_the_blocks_are_found() -> None:
    # durable.operations' module docstring shows a minimal operation: found, or this
    # module checks nothing.
    (example,) = literal_blocks(inspect.getdoc(importlib.import_module("durable.operations")))
    assert "class Resize(Operation)" in example
