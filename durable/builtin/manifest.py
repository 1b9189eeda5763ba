"""A backup's manifest and checksum list: building them and checking a backup against them.

Pure functions (no file system, no clock): the I/O lives in
``durable.builtin.backupdir``. A published backup directory holds

- ``<model label>.<part>.jsonl.gz`` — the rows of one batch, gzip-compressed
  JSON Lines whose first line is a header naming the table and columns;
- ``manifest.json`` — what the backup contains: every table with its
  columns, row count and order-independent digest, every part file with its
  size, row count and SHA-256;
- ``SHA256SUMS`` — the SHA-256 of every file above *including the
  manifest*, in ``sha256sum`` format, so ``sha256sum -c SHA256SUMS`` checks
  a backup without this software.

Both are written last and the directory is published by an atomic rename,
so a directory without them is partial, never "a backup with nothing in it".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

FORMAT = "durable-backup/1"
MANIFEST = "manifest.json"
SUMS = "SHA256SUMS"
PART_NAME = re.compile(r"^[a-z0-9_]+\.[a-z0-9_]+\.\d{6}\.jsonl\.gz$")
_SUM_LINE = re.compile(r"^([0-9a-f]{64}) [ *](\S.*)$")


def part_name(label: str, index: int) -> str:
    return f"{label}.{index:06d}.jsonl.gz"


def format_sums(digests: Mapping[str, str]) -> str:
    """``sha256sum`` format, sorted by file name."""
    return "".join(f"{digests[name]}  {name}\n" for name in sorted(digests))


def parse_sums(text: str) -> dict[str, str]:
    """Parse ``sha256sum`` output; raise ValueError on a line that is not one."""
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = _SUM_LINE.match(line)
        if match is None:
            raise ValueError(f"{SUMS} line {number} is not '<sha256>  <file>'")
        digest, name = match.groups()
        if name in sums:
            raise ValueError(f"{SUMS} lists {name} twice")
        sums[name] = digest
    return sums


def build_manifest(
    *,
    job_id: int,
    database: str,
    vendor: str,
    started_at: str,
    finished_at: str,
    consistency: str,
    migrations: Mapping[str, str],
    tables: Sequence[Mapping[str, Any]],
    parts: Mapping[str, Sequence[Mapping[str, Any]]],
) -> dict[str, Any]:
    """The manifest as a JSON-ready dict.

    ``tables``: ``{"model", "table", "columns", "pk", "digest"}`` per table, in
    the order the backup was taken. ``parts[label]``: ``{"file", "rows",
    "bytes", "sha256"}`` per part, in part order.
    """
    described = []
    for table in tables:
        label = table["model"]
        table_parts = [dict(part) for part in parts.get(label, [])]
        described.append(
            {
                "model": label,
                "table": table["table"],
                "columns": list(table["columns"]),
                "pk": table["pk"],
                "rows": sum(part["rows"] for part in table_parts),
                "digest": table["digest"],
                "parts": table_parts,
            }
        )
    return {
        "format": FORMAT,
        "job_id": job_id,
        "database": database,
        "vendor": vendor,
        "started_at": started_at,
        "finished_at": finished_at,
        "consistency": consistency,
        "migrations": dict(sorted(migrations.items())),
        "tables": described,
    }


def manifest_files(manifest: Mapping[str, Any]) -> dict[str, tuple[int, str]]:
    """Every part file the manifest lists: name -> (bytes, sha256)."""
    files: dict[str, tuple[int, str]] = {}
    for table in manifest["tables"]:
        for part in table["parts"]:
            files[part["file"]] = (int(part["bytes"]), part["sha256"])
    return files


def shape_problems(manifest: Any) -> list[str]:
    """What makes a parsed manifest unusable (empty list: usable)."""
    if not isinstance(manifest, dict):
        return ["manifest.json is not a JSON object"]
    if manifest.get("format") != FORMAT:
        return [f"unknown backup format {manifest.get('format')!r} (expected {FORMAT})"]
    tables = manifest.get("tables")
    if not isinstance(tables, list):
        return ["manifest.json has no table list"]
    problems = []
    seen: set[object] = set()
    for table in tables:
        if not isinstance(table, dict) or not isinstance(table.get("parts"), list):
            problems.append("manifest.json has a malformed table entry")
            continue
        label = table.get("model")
        if label in seen:
            problems.append(f"manifest.json lists {label} twice")
        seen.add(label)
        if not isinstance(table.get("columns"), list) or table.get("pk") not in table["columns"]:
            problems.append(f"{label}: columns or primary key missing from the manifest")
        for part in table["parts"]:
            name = part.get("file") if isinstance(part, dict) else None
            if not isinstance(name, str) or not PART_NAME.match(name):
                problems.append(f"{label}: part entry with an unsafe or missing file name")
            elif not name.startswith(f"{label}."):
                problems.append(f"{label}: part {name} belongs to another table")
    return problems


def inventory_problems(
    expected: Mapping[str, tuple[int, str]],
    sums: Mapping[str, str],
    actual: Mapping[str, tuple[int, str] | None],
) -> list[str]:
    """Compare the manifest, the checksum list and what is on disk; every difference is a problem.

    ``expected``: from the manifest. ``sums``: from SHA256SUMS (without the
    manifest's own line). ``actual``: name -> (bytes, sha256) as read, or
    None for a file that is not there.
    """
    problems = []
    for name in sorted(set(expected) | set(sums)):
        if name not in expected:
            problems.append(f"{name} is in {SUMS} but not in the manifest")
            continue
        if name not in sums:
            problems.append(f"{name} is in the manifest but not in {SUMS}")
        size, digest = expected[name]
        if name in sums and sums[name] != digest:
            problems.append(f"{name}: the manifest and {SUMS} disagree on its SHA-256")
        found = actual.get(name)
        if found is None:
            problems.append(f"{name} is missing")
            continue
        found_size, found_digest = found
        if found_size != size:
            problems.append(f"{name}: {found_size} bytes, the manifest recorded {size}")
        elif found_digest != digest:
            problems.append(f"{name}: SHA-256 mismatch (the file changed after it was written)")
    return problems


def is_excluded(label: str, exclude: set[str] | frozenset[str]) -> bool:
    """``exclude`` holds app labels and ``app_label.model`` labels."""
    return label in exclude or label.split(".", 1)[0] in exclude


def restore_problems(
    manifest: Mapping[str, Any],
    site_columns: Mapping[str, Sequence[str]],
    exclude: set[str] | frozenset[str] = frozenset(),
) -> list[str]:
    """Why the backup's tables cannot be restored into this site's tables (empty: they can).

    ``site_columns``: label -> columns of every table a restore may write.
    A backup table must exist here with the same columns (in any order): a row with a
    column missing here would lose data, a column missing from the backup
    has no value to write. Excluded tables are skipped, not problems.
    """
    problems = []
    for table in manifest["tables"]:
        label = table["model"]
        if is_excluded(label, exclude):
            continue
        if label not in site_columns:
            problems.append(f"the backup has table {label}, which this site does not restore")
        elif sorted(site_columns[label]) != sorted(table["columns"]):
            problems.append(
                f"{label}: the backup's columns {list(table['columns'])} differ from this "
                f"database's {list(site_columns[label])} (migrate to the backup's schema first)"
            )
    return problems


def reorder(rows: Sequence[Sequence[Any]], source: Sequence[str], target: Sequence[str]) -> list:
    """Rows with columns ``source`` rearranged into the order ``target`` (same names)."""
    if list(source) == list(target):
        return [list(row) for row in rows]
    positions = [list(source).index(name) for name in target]
    return [[row[i] for i in positions] for row in rows]
