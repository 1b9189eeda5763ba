"""Find every environment variable and project setting the code reads, for the settings reference.

A variable the code reads but docs/reference/settings.md does not name fails the docs
build (durable_docs) and the test suite (tests/docs/test_settings_reference.py). The
scan reads the source with ``ast`` instead of trusting a hand-kept list:

* ``os.environ.get("X")``, ``os.environ["X"]``, ``os.getenv("X")``, ``"X" in os.environ``,
  ``os.environ.setdefault("X", ...)``, on any ``environ`` mapping;
* helpers that read the environment (or the settings) with their first parameter,
  such as ``env_bool(name)``: every call of them with a literal name counts;
* ``for name in SOME_TUPLE: environ.get(name)`` over a module-level tuple of literals;
* ``getattr(settings, "X", ...)`` and ``settings.X`` where ``X`` is not one of Django's
  own settings (those are documented by Django);
* any other string literal that looks like one of ours (``DURABLE_…``, ``RECOVERY_…``).

A read whose name the scan cannot work out fails too, until it is listed in
``DYNAMIC`` with the name (or ``PREFIX<NAME>`` pattern) it stands for.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("durable", "recovery", "gunicorn.conf.py", "manage.py")
OURS = re.compile(r"^(DURABLE|RECOVERY)_[A-Z][A-Z0-9_]*$")
NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")

# Reads whose name is computed. Key: "path:function"; value: what the docs must name.
DYNAMIC = {
    # DURABLE_CREDENTIAL_<NAME>: one variable per credential reference (credentials.env_name).
    "durable/credentials.py:from_environment": "DURABLE_CREDENTIAL_<NAME>",
}


@dataclass(frozen=True)
class Read:
    name: str  # the variable or setting, or a "PREFIX_<NAME>" pattern
    kind: str  # "environment" or "setting"
    where: str  # path:line


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _is_settings(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "settings"


def _literal(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _environ_key(node: ast.AST) -> ast.AST | None:
    """The key expression if ``node`` reads the environment, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        func = node.func
        if _is_environ(func.value) and func.attr in {"get", "setdefault", "pop"}:
            return node.args[0]
        if isinstance(func.value, ast.Name) and func.value.id == "os" and func.attr == "getenv":
            return node.args[0]
    if isinstance(node, ast.Subscript) and _is_environ(node.value):
        return node.slice
    if (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], ast.In | ast.NotIn)
        and _is_environ(node.comparators[0])
    ):
        return node.left
    return None


def _settings_key(node: ast.AST) -> ast.AST | None:
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"getattr", "hasattr"}
        and len(node.args) >= 2
        and _is_settings(node.args[0])
    ):
        return node.args[1]
    return None


def _files() -> Iterable[Path]:
    for source in SOURCES:
        path = ROOT / source
        if path.is_file():
            yield path
        else:
            yield from sorted(p for p in path.rglob("*.py") if "migrations" not in p.parts)


class _Scanner(ast.NodeVisitor):
    def __init__(self, rel: str, tuples: dict[str, tuple[str, ...]]) -> None:
        self.rel = rel
        self.tuples = tuples
        self.reads: list[Read] = []
        self.unresolved: list[str] = []
        self.helpers: dict[str, str] = {}  # function name -> kind, for reads by parameter
        self.loops: dict[str, tuple[str, ...]] = {}
        self.function: list[ast.FunctionDef | ast.AsyncFunctionDef] = []

    def _where(self, node: ast.AST) -> str:
        return f"{self.rel}:{getattr(node, 'lineno', 0)}"

    def _key(self, key: ast.AST, kind: str, node: ast.AST) -> None:
        if (name := _literal(key)) is not None:
            self.reads.append(Read(name, kind, self._where(node)))
            return
        if isinstance(key, ast.Name) and key.id in self.loops:
            for name in self.loops[key.id]:
                self.reads.append(Read(name, kind, self._where(node)))
            return
        function = self.function[-1] if self.function else None
        params = [a.arg for a in function.args.args] if function else []
        if function and isinstance(key, ast.Name) and params and key.id == params[0]:
            self.helpers[function.name] = kind  # its callers pass the name
            return
        label = f"{self.rel}:{function.name if function else '<module>'}"
        if label in DYNAMIC:
            self.reads.append(Read(DYNAMIC[label], kind, self._where(node)))
            return
        self.unresolved.append(f"{self._where(node)} ({label})")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.function.append(node)
        self.generic_visit(node)
        self.function.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_For(self, node: ast.For) -> None:
        if (
            isinstance(node.target, ast.Name)
            and isinstance(node.iter, ast.Name)
            and node.iter.id in self.tuples
        ):
            self.loops[node.target.id] = self.tuples[node.iter.id]
            self.generic_visit(node)
            del self.loops[node.target.id]
            return
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _is_settings(node.value) and NAME.match(node.attr):
            self.reads.append(Read(node.attr, "setting", self._where(node)))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and OURS.match(node.value):
            # "DURABLE_CREDENTIAL_" + name: a family of variables, documented as a pattern.
            name = node.value + "<NAME>" if node.value.endswith("_") else node.value
            self.reads.append(Read(name, "setting", self._where(node)))

    def generic_visit(self, node: ast.AST) -> None:
        if (key := _environ_key(node)) is not None:
            self._key(key, "environment", node)
        elif (key := _settings_key(node)) is not None:
            self._key(key, "setting", node)
        super().generic_visit(node)


def _module_tuples(tree: ast.Module) -> dict[str, tuple[str, ...]]:
    found = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Tuple | ast.List)
        ):
            values = [_literal(item) for item in node.value.elts]
            if values and all(values):
                found[node.targets[0].id] = tuple(values)  # type: ignore[arg-type]
    return found


def _calls(tree: ast.AST, helper: str) -> Iterable[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name == helper:
                yield node


def scan() -> tuple[list[Read], list[str]]:
    """Every read the code makes, and the reads whose name could not be worked out."""
    from django.conf import global_settings

    django_settings = {name for name in dir(global_settings) if NAME.match(name)}
    trees = {}
    reads: list[Read] = []
    unresolved: list[str] = []
    helpers: dict[str, str] = {}
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        trees[rel] = tree
        scanner = _Scanner(rel, _module_tuples(tree))
        scanner.visit(tree)
        reads += scanner.reads
        unresolved += scanner.unresolved
        helpers.update(scanner.helpers)
    for rel, tree in trees.items():
        for helper, kind in helpers.items():
            for call in _calls(tree, helper):
                if (name := _literal(call.args[0])) is not None and NAME.match(name):
                    reads.append(Read(name, kind, f"{rel}:{call.lineno}"))
    # Django's own settings are Django's to document, unless we read them from the
    # environment (then they are ours: DEBUG, EMAIL_HOST, ...).
    reads = [r for r in reads if r.kind == "environment" or r.name not in django_settings]
    # Names our settings module defines from the environment are documented as variables.
    return reads, unresolved


def documented(markdown: str) -> set[str]:
    """Names a page documents: every `NAME` in backquotes (code spans)."""
    return set(re.findall(r"`([A-Z][A-Z0-9_]*(?:<[A-Z]+>)?)`", markdown))


def missing(markdown: str) -> list[Read]:
    """Reads whose name the page does not mention, first occurrence of each."""
    reads, _ = scan()
    names = documented(markdown)
    seen: dict[str, Read] = {}
    for read in reads:
        if read.name not in names and read.name not in seen:
            seen[read.name] = read
    return sorted(seen.values(), key=lambda r: r.name)
