"""The project's modules import one way: layers, no cycles, no imports hidden in functions.

The layers and their arrows are described on the architecture page
(docs/explanation/architecture.md); this is the test that holds the code to it.
An AST scan of ``durable/`` and ``recovery/`` (migrations aside: they import
the code of their time inside functions, by design) fails on

- an import cycle between modules;
- a module importing one of a higher layer (the models importing the worker,
  the engine importing an operation, anything of ``durable`` importing the site);
- the worker importing an operation or an operation the worker (they meet only
  through the registry, ``durable.operations``);
- an import of a project module inside a function (``AppConfig.ready()``
  excepted: Django asks for that one), which is how a cycle is papered over;
- a project module importing an old path kept only for code outside the project;
- a dashboard view module importing another (each page stands alone);
- a module that writes jobs asking which database it runs on: their SQL is
  ``durable.sql``'s, one module per vendor behind one interface.

Importing ``a.b.c`` runs the ``__init__`` of ``a.b`` first, so the scan counts an
edge to every package on the way that the importer is not itself inside: a
package ``__init__`` that imports its I/O modules drags them into every module
that wants one of its pure ones.
"""

from __future__ import annotations

import ast
import functools
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from tests.conftest import BASE_DIR
from tests.unit.test_recovery_boundary import module_name

PACKAGES = ("durable", "recovery")
# The old ``models`` modules of the sub-packages whose models moved into durable.models,
# kept for code outside the project (and for migrations): the project imports the layer.
LEGACY = frozenset(
    f"durable.{package}.models"
    for package in ("api", "builtin", "http", "mail", "metrics", "schedules", "webhooks")
)

# Lowest first. A module may import modules of its own layer and of lower ones.
# Patterns are fnmatch patterns on module names; the most specific match wins
# (an exact name before a pattern, a longer pattern before a shorter one).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "rules",  # pure decisions and the shared vocabulary (errors, signals): no ORM, no I/O
        (
            "durable.rules", "durable.states", "durable.policy", "durable.errors",
            "durable.signals", "durable.sanitize", "durable.clientip", "durable.outage",
            "durable.*.policy",
            "durable.http.addresses", "durable.http.errors",
            "durable.api.errors", "durable.api.parse", "durable.api.tokens",
            "durable.builtin.derived", "durable.builtin.inventory", "durable.builtin.manifest",
            "durable.schedules.timing", "durable.tasks.compat", "durable.endings",
            # package __init__ modules that import nothing
            "durable", "durable.api", "durable.builtin", "durable.http", "durable.mail",
            "durable.webhooks", "durable.schedules", "durable.management",
            "durable.management.commands",
        ),
    ),
    (
        "models",  # every table of the engine
        ("durable.models", "durable.models.*", *sorted(LEGACY)),
    ),
    # jobs, leases, rescue, notify, outbound HTTP, schedules, and the process-level helpers
    # (fault points, SQLite's writer turns, wake-ups, log lines)
    ("engine", ("durable.*",)),
    (
        "operations",  # what the worker runs, registered in durable.operations
        ("durable.builtin.*", "durable.mail.operations", "durable.webhooks.operations",
         "durable.tasks", "durable.tasks.*"),
    ),
    ("worker", ("durable.worker", "durable.worker.*")),
    (
        "surfaces",  # what people and programs call: HTTP, admin, commands, app loading
        ("durable.admin", "durable.apps", "durable.api.*", "durable.metrics.views",
         "durable.metrics.urls", "durable.management.*", "durable.schedules.admin",
         "durable.builtin.cli"),
    ),
    ("site", ("recovery", "recovery.*")),  # the Recovery app and the site configuration
]  # fmt: skip
# Neither imports the other: the worker runs operations it finds in the registry.
SIBLINGS = frozenset({("worker", "operations"), ("operations", "worker")})
RANK = {name: rank for rank, (name, _) in enumerate(LAYERS)}
RANK["worker"] = RANK["operations"]

# The dashboard modules urls.py routes to: the site's top, importing none of each other.
# The modules that write jobs: their SQL comes from durable.sql, chosen once per vendor.
VENDOR_BLIND = ("durable.lease", "durable.transitions", "durable.jobs", "durable.rescue")
VENDOR_NAMES = frozenset({"postgresql", "sqlite", "mysql", "oracle"})

VIEW_MODULES = frozenset(
    f"recovery.dashboard.{name}"
    for name in ("views", "console", "jobs", "job_actions", "job_bulk", "new_job", "record")
) | {"recovery.dashboard.schedules"}


def project_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((BASE_DIR / package).rglob("*.py"))
        if "migrations" not in path.relative_to(BASE_DIR).parts
    }


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def imports(path: Path, module: str, source: str | None = None) -> list[tuple[int, str, bool]]:
    """(line, imported module, inside a function) of each import in ``path``.

    ``from p import name`` names ``p.name`` when that is a module, else ``p``.
    Pure apart from reading the file.
    """
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    package = _package_of(module, path)
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            in_function.update(id(inner) for inner in ast.walk(node) if inner is not node)
    found = []
    for node in ast.walk(tree):
        local = id(node) in in_function
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, local) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            found += [(node.lineno, f"{base}.{alias.name}", local) for alias in node.names]
    return found


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module ``name`` is, or is inside of (``a.b.Class`` → ``a.b``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def targets(importer: str, imported: str, modules: dict[str, Path]) -> set[str]:
    """The modules importing ``imported`` runs: it, and each package on the way that
    ``importer`` is not inside (its own packages are being imported already)."""
    found = resolve(imported, modules)
    if found is None:
        return set()
    result = {found}
    parts = found.split(".")
    for end in range(1, len(parts)):
        package = ".".join(parts[:end])
        if not (importer == package or importer.startswith(f"{package}.")):
            result.add(package)
    result.discard(importer)
    return result


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        graph[module] = set()
        for _, name, _ in imports(path, module):
            graph[module] |= targets(module, name, modules)
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


def _specificity(pattern: str) -> tuple[int, int]:
    return (0 if "*" in pattern else 1, len(pattern))


def layer_of(module: str) -> str:
    """The layer whose most specific pattern matches ``module``. Pure."""
    matches = [
        (_specificity(pattern), name)
        for name, patterns in LAYERS
        for pattern in patterns
        if fnmatchcase(module, pattern)
    ]
    if not matches:
        raise LookupError(f"{module} is in no layer: add it to LAYERS")
    return max(matches)[1]


def may_import(importer: str, imported: str) -> bool:
    """Whether a module of layer ``importer`` may import one of layer ``imported``. Pure."""
    if (importer, imported) in SIBLINGS:
        return False
    return RANK[imported] <= RANK[importer]


def vendor_checks(source: str) -> list[tuple[int, str]]:
    """(line, what) of each place ``source`` asks which database it runs on. Pure.

    ``x.vendor``, a dialect's ``x.pg`` flag, or a vendor's name compared with something.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("vendor", "pg"):
            found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Constant) and side.value in VENDOR_NAMES:
                    found.append((node.lineno, repr(side.value)))
    return sorted(found)


# --- the scan's own rules, on small tables ------------------------------------------------


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


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("durable.rules", "rules"),
        ("durable.webhooks.policy", "rules"),  # durable.*.policy: pure wherever it lives
        ("durable.models.jobs", "models"),
        ("durable.api.models", "models"),  # an old path, exact name before durable.api.*
        ("durable.lease", "engine"),  # the catch-all durable.*
        ("durable.transitions", "engine"),
        ("durable.builtin.backup", "operations"),
        ("durable.builtin.derived", "rules"),  # an exact name before durable.builtin.*
        ("durable.endings", "rules"),  # how a lease ends, decided: pure
        ("durable.sql.postgresql", "engine"),  # a vendor's statements: the catch-all durable.*
        ("durable.worker", "worker"),
        ("durable.worker.renewal", "worker"),  # the worker package's parts, not the engine's
        ("durable.api.views", "surfaces"),
        ("durable.api.parse", "rules"),
        ("recovery.dashboard.views", "site"),
    ],
)
def test_layer_of__the_most_specific_pattern_wins(module, layer):
    assert layer_of(module) == layer


@pytest.mark.parametrize(
    ("importer", "imported", "allowed"),
    [
        ("engine", "models", True),
        ("models", "engine", False),  # a model never imports the code that writes it
        ("models", "worker", False),
        ("operations", "engine", True),
        ("engine", "operations", False),
        ("worker", "operations", False),  # siblings: they meet in the registry
        ("operations", "worker", False),
        ("surfaces", "worker", True),
        ("engine", "site", False),  # durable never imports recovery
        ("site", "surfaces", True),
    ],
)
def test_may_import__one_way_only(importer, imported, allowed):
    assert may_import(importer, imported) is allowed


MODULES = {
    "p": BASE_DIR / "p" / "__init__.py",
    "p.a": BASE_DIR / "p" / "a.py",
    "p.sub": BASE_DIR / "p" / "sub" / "__init__.py",
    "p.sub.pure": BASE_DIR / "p" / "sub" / "pure.py",
}


@pytest.mark.parametrize(
    ("importer", "source", "expected"),
    [
        ("p.a", "from .sub import pure", {"p.sub", "p.sub.pure"}),  # runs p.sub's __init__
        ("p.a", "from .sub.pure import f", {"p.sub", "p.sub.pure"}),
        ("p.a", "import p.sub.pure", {"p.sub", "p.sub.pure"}),
        ("p.sub.pure", "from . import other", {"p.sub"}),  # a name of its own package
        ("p.a", "from . import a", set()),  # itself
        ("p.a", "import os", set()),
        ("p.sub.pure", "from ..a import thing", {"p.a"}),  # its own packages: already running
    ],
)
def test_targets__every_module_an_import_runs(importer, source, expected):
    path = MODULES[importer]
    found = set()
    for _, name, _ in imports(path, importer, source):
        found |= targets(importer, name, MODULES)
    assert found == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("pg = connection.vendor == 'postgresql'", [(1, "'postgresql'"), (1, ".vendor")]),
        ("if d.pg:\n    pass", [(1, ".pg")]),  # the old dialect's flag
        ("x = 'sqlite' if a else b", []),  # a name, not a question about the database
        ("if name != 'sqlite':\n    pass", [(1, "'sqlite'")]),
        ("statements(conn).renew(cursor, now, fenced, 30)", []),  # asks the SQL layer
    ],
)
def test_vendor_checks__finds_a_question_about_the_database(source, expected):
    assert vendor_checks(source) == expected


def test_imports__tells_a_function_local_import():
    source = "import os\n\ndef f():\n    from . import a\n\nclass C:\n    def m(self):\n" + (
        "        import p.sub\n"
    )
    found = imports(MODULES["p.a"], "p.a", source)
    assert [(name, local) for _, name, local in found] == [
        ("os", False),
        ("p.a", True),
        ("p.sub", True),
    ]


# --- the project -------------------------------------------------------------------------


@functools.cache
def project_graph() -> dict[str, set[str]]:
    """The project's import graph, read once for the tests below (each only reads it)."""
    return import_graph(project_modules())


def test_the_scan_sees_the_engine_and_the_site():
    graph = project_graph()
    assert VIEW_MODULES - set(graph) == set()  # every view module still exists under its name
    assert "durable.models" in graph["durable.lease"]
    assert "recovery.dashboard.context" in graph["recovery.dashboard.views"]


def test_every_module_is_in_a_layer():
    assert {module: layer_of(module) for module in project_modules()}  # raises if one is not


def test_no_import_cycle():
    assert cycles(project_graph()) == []


def test_no_module_imports_a_higher_layer():
    graph = project_graph()
    offenders = sorted(
        f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})"
        for module, found in graph.items()
        for target in found
        if not may_import(layer_of(module), layer_of(target))
    )
    assert offenders == []


def test_the_worker_package_is_one_layer_that_only_the_surfaces_import():
    graph = project_graph()
    parts = {module for module in graph if module.split(".")[:2] == ["durable", "worker"]}
    assert len(parts) > 5  # the package and its modules, each named for what it does
    assert {layer_of(module) for module in parts} == {"worker"}
    importers = sorted(
        f"{module} ({layer_of(module)})"
        for module, found in graph.items()
        if found & parts and module not in parts and layer_of(module) not in {"surfaces", "site"}
    )
    assert importers == []


def test_no_module_imports_an_old_path():
    graph = project_graph()
    offenders = {module: sorted(found & LEGACY) for module, found in graph.items()}
    assert {module: found for module, found in offenders.items() if found} == {}


def test_no_view_module_imports_another():
    graph = project_graph()
    offenders = {module: sorted(graph[module] & VIEW_MODULES) for module in VIEW_MODULES}
    assert {module: found for module, found in offenders.items() if found} == {}


def test_no_job_writer_asks_which_database_it_runs_on():
    modules = project_modules()
    assert set(VENDOR_BLIND) <= set(modules)  # each still exists under its name
    offenders = {
        f"{modules[module].relative_to(BASE_DIR)}:{line}: {what}"
        for module in VENDOR_BLIND
        for line, what in vendor_checks(modules[module].read_text(encoding="utf-8"))
    }
    assert sorted(offenders) == []


def test_no_function_imports_a_project_module():
    modules = project_modules()
    offenders = {
        f"{path.relative_to(BASE_DIR)}:{line}: {resolve(name, modules)}"
        for module, path in modules.items()
        for line, name, local in imports(path, module)
        if local and resolve(name, modules) and not _in_ready(path, line)
    }
    assert sorted(offenders) == []


def _in_ready(path: Path, line: int) -> bool:
    """Whether ``line`` of ``path`` is inside an ``AppConfig.ready()`` (of an apps.py)."""
    if path.name != "apps.py":
        return False
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(
        isinstance(node, ast.FunctionDef)
        and node.name == "ready"
        and node.lineno <= line <= (node.end_lineno or node.lineno)
        for node in ast.walk(tree)
    )
