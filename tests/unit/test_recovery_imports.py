"""The site's modules import one way: no cycles, and the dashboard's views sit on top.

A cycle papered over with an import inside a function works until someone moves
that import; a view module importing another view module for a helper makes
each page depend on every other. So: an AST scan of ``recovery/`` (migrations
aside: they import the code of their time inside functions, by design) that
fails on an import cycle, on a view module importing another, and on an import
of one of the site's own modules inside a function (``AppConfig.ready()``
excepted: Django asks for that one).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import BASE_DIR
from tests.unit.test_recovery_boundary import imported_names, module_name

SITE = BASE_DIR / "recovery"
# The modules urls.py routes to: the top layer, importing none of each other.
VIEW_MODULES = frozenset(
    f"recovery.dashboard.{name}"
    for name in (
        "views",
        "console",
        "jobs",
        "job_actions",
        "job_bulk",
        "new_job",
        "record",
        "schedules",
    )
)


def site_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for path in sorted(SITE.rglob("*.py"))
        if "migrations" not in path.relative_to(SITE).parts
    }


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the site's modules it imports (``from .x import name`` counts as ``.x``)."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for _, name in imported_names(path):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name not in (module, "recovery"):
                targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of ``graph`` with more than one module (Tarjan). Pure."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            part = []
            while True:
                member = stack.pop()
                part.append(member)
                if member == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": set()}, []),  # one way
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),  # the views ↔ console kind
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),  # a longer loop
    ],
)
def test_cycles__finds_every_loop_and_only_loops(graph, expected):
    assert cycles(graph) == expected


def test_the_scan_sees_the_site_and_its_dashboard():
    graph = import_graph(site_modules())
    assert VIEW_MODULES - set(graph) == set()  # every view module still exists under its name
    assert "recovery.dashboard.context" in graph["recovery.dashboard.views"]


def test_the_site_has_no_import_cycle():
    assert cycles(import_graph(site_modules())) == []


def test_no_view_module_imports_another():
    graph = import_graph(site_modules())
    offenders = {module: sorted(graph[module] & VIEW_MODULES) for module in VIEW_MODULES}
    assert {module: found for module, found in offenders.items() if found} == {}


def local_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, function, module) of each import statement inside a function of ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom):
                    module = "." * node.level + (node.module or "")
                    found.append((node.lineno, function.name, module))
                elif isinstance(node, ast.Import):
                    found += [(node.lineno, function.name, a.name) for a in node.names]
    return found


def names_a_site_module(module: str) -> bool:
    return module.startswith(".") or module == "recovery" or module.startswith("recovery.")


def test_no_function_imports_one_of_the_sites_modules():
    offenders = [
        f"{path.relative_to(BASE_DIR)}:{line} in {function}(): {module}"
        for path in site_modules().values()
        for line, function, module in local_imports(path)
        if names_a_site_module(module) and not (path.name == "apps.py" and function == "ready")
    ]
    assert offenders == []
