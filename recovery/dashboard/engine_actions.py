"""The operator's actions on jobs, each one call into ``durable.jobs``.

The engine locks, decides (``durable.states``) and writes the event; its
``Outcome`` says applied / already so / refused. Used by the one-job buttons and
by the bulk form alike, so both act the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durable import jobs as engine

from . import rollup


def apply_to(action: str, ids: list[int], actor: str) -> list[Any]:
    """The engine's outcomes of ``action`` on ``ids`` (discard deletes: its own call)."""
    if action == "discard":
        rollup.count_before_deleting()  # the throughput history keeps them
        return engine.discard(ids)
    return engine.act(action, ids, actor=actor)


ENGINE_ACTIONS: dict[str, Callable[..., Any]] = {
    "pause": engine.pause,
    "resume": engine.resume,
    "cancel": engine.cancel,
    "retry": engine.retry_now,
    "discard": lambda job_id, actor: apply_to("discard", [job_id], actor)[0],
}
