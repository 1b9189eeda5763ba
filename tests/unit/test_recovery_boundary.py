"""The engine never imports the site: ``durable`` announces through signals
(docs: explanation/recovery-and-security-events.md, "What the engine reports").

An AST scan of every module under ``durable/`` — plain and relative imports,
and ``importlib.import_module``/``__import__`` with a literal name — so a
stray ``from recovery.models import …`` fails here, not in someone's project
that uses ``durable`` without ``recovery``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import BASE_DIR

ENGINE = BASE_DIR / "durable"
SITE = "recovery"
_DYNAMIC = frozenset({"import_module", "__import__"})


def module_name(path: Path) -> str:
    parts = list(path.relative_to(BASE_DIR).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, relative ones resolved."""
    if source is None:
        source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                prefix = ".".join(base)
                module = f"{prefix}.{node.module}" if node.module else prefix
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # "from x import recovery" names a module too
            found += [(node.lineno, f"{module}.{alias.name}".lstrip(".")) for alias in node.names]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _DYNAMIC and node.args and isinstance(node.args[0], ast.Constant):
                found.append((node.lineno, str(node.args[0].value)))
    return found


def names_the_site(module: str) -> bool:
    return module == SITE or module.startswith(f"{SITE}.")


def engine_modules() -> list[Path]:
    return sorted(ENGINE.rglob("*.py"))


def test_the_scan_sees_the_engine_and_resolves_its_relative_imports():
    assert len(engine_modules()) > 20  # the real package, subpackages included
    worker = [module for _, module in imported_names(ENGINE / "worker" / "lifecycle.py")]
    assert "durable.signals" in worker or "durable.lease" in worker  # "from . import …"


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("import recovery", True),
        ("import recovery.models as m", True),
        ("from recovery import records", True),
        ("from recovery.records import record_event", True),
        ("import importlib\nimportlib.import_module('recovery.receivers')", True),
        ("__import__('recovery')", True),
        ("from .. import recovery", True),  # from durable/x.py: the top-level package
        ("import recoveryx", False),  # only the package itself, not a lookalike
        ("from durable import signals", False),
        ("from . import signals", False),
    ],
)
def test_imported_names__finds_every_spelling(source, flagged):
    probe = ENGINE / "_boundary_probe.py"  # never written: only its module name is used
    names = [module for _, module in imported_names(probe, source)]
    assert any(names_the_site(name) for name in names) is flagged, names


def test_durable_never_imports_recovery():
    offenders = [
        f"{path.relative_to(BASE_DIR)}:{line}: {module}"
        for path in engine_modules()
        for line, module in imported_names(path)
        if names_the_site(module)
    ]
    assert offenders == [], "durable must announce through signals, not import recovery"
