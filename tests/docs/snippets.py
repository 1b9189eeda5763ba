"""Code blocks of the README and the docs pages, so tests can run them as written."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    page: str  # path relative to the repository root
    line: int  # 1-based line of the opening fence
    language: str
    code: str

    def run(self, namespace: dict | None = None, module: str = "docs_example") -> dict:
        """Execute the block as a module named ``module`` (so operations register under it)."""
        namespace = {"__name__": module, **(namespace or {})}
        exec(compile(self.code, f"{self.page}:{self.line}", "exec"), namespace)  # noqa: S102 - our own docs
        return namespace


def pages() -> list[Path]:
    docs = sorted(
        p for p in (ROOT / "docs").rglob("*.md") if not {"_build", "_generated"} & set(p.parts)
    )
    return [ROOT / "README.md", *docs]


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        language = match["info"].strip().split(" ")[0].strip("{}")
        body = []
        end = index + 1
        while end < len(lines) and lines[end].strip() != fence:
            body.append(lines[end])
            end += 1
        code = textwrap.dedent(
            "\n".join(line[indent:] if line[:indent].isspace() else line for line in body)
        )
        found.append(Block(page.relative_to(ROOT).as_posix(), index + 1, language, code + "\n"))
        index = end + 1
    return found


def all_blocks(language: str) -> list[Block]:
    return [block for page in pages() for block in blocks(page) if block.language == language]


def find(page: str, marker: str, language: str = "python") -> Block:
    """The one block of ``page`` in ``language`` that contains ``marker``."""
    matching = [b for b in blocks(ROOT / page) if b.language == language and marker in b.code]
    assert len(matching) == 1, f"{page}: {len(matching)} {language} blocks contain {marker!r}"
    return matching[0]
