"""What an app tells backup, restore and ``db.copy`` about its tables: derived and journal.

The operations move rows by primary key and compare them raw. Two kinds of
table break that, and only the app that owns them knows which they are:

- **Derived** tables hold nothing of their own: their rows are computed from
  other tables (per-day counts, a search index, its cursor, anything a
  trigger maintains). Copied raw they are wrong — a trigger on the target
  counts the copied rows again on top of the copied counts, and a search
  cursor copied without its index claims rows are indexed that are not. So
  they are **never backed up, copied, restored or compared**; after rows of
  their sources were written, the operation calls the app's ``rebuild`` on
  that database instead.
- **Journal** tables are append-only logs the engine itself writes to while
  any job runs — the Recovery events, where a reclaim of the copy's own job
  lands. A row appended to a journal during a copy is copied (by the
  verification of its range, or the copy's final ``tail`` unit) instead of
  failing the copy; a row changed or deleted in a journal still fails it.

``durable`` never imports the apps: they register here in ``AppConfig.ready``
(``recovery`` registers its counts, search cursor and events).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

_derived: dict[str, Derived] = {}
_journals: set[str] = set()


@dataclass(frozen=True)
class Derived:
    """``tables`` are computed from ``sources`` (model labels, lower case).

    ``rebuild(alias)`` recomputes them on that database from what its
    sources hold now. It must be idempotent and bounded enough for one unit
    (it may leave the rest to the app's own catch-up, as long as readers see
    exact results meanwhile), and must tolerate writers on the sources.
    """

    name: str
    tables: frozenset[str]
    sources: frozenset[str]
    rebuild: Callable[[str], None]


def register_derived(
    name: str, *, tables: Iterable[str], sources: Iterable[str], rebuild: Callable[[str], None]
) -> None:
    """Declare derived tables; registering the same ``name`` again replaces it."""
    _derived[name] = Derived(
        name=name,
        tables=frozenset(label.lower() for label in tables),
        sources=frozenset(label.lower() for label in sources),
        rebuild=rebuild,
    )


def register_journal(label: str) -> None:
    """Declare an append-only table the engine writes to during any job (see module doc)."""
    _journals.add(label.lower())


def derived_labels() -> frozenset[str]:
    return frozenset(label for entry in _derived.values() for label in entry.tables)


def is_journal(label: str) -> bool:
    return label in _journals


def rebuilds_after(written: Iterable[str]) -> list[Derived]:
    """The derived groups to rebuild after rows of tables ``written`` changed, by name."""
    changed = set(written)
    return [entry for _, entry in sorted(_derived.items()) if entry.sources & changed]
