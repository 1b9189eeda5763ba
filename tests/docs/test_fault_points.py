"""docs/reference/fault-points.md names every fault point the code can reach."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def reached() -> set[str]:
    """Names passed to ``reach("…")`` calls (parsed, so docstrings do not count)."""
    points = set()
    for path in [*ROOT.glob("durable/**/*.py"), *ROOT.glob("recovery/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                arg = node.args[0]
                if name == "reach" and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    points.add(arg.value)
    return points


def test_every_fault_point_is_documented() -> None:
    points = reached()
    assert {"after_unit", "files.after_copy", "webhook_after_post"} <= points  # the scan works
    page = (ROOT / "docs" / "reference" / "fault-points.md").read_text(encoding="utf-8")
    assert {p for p in points if f"`{p}`" not in page} == set()
