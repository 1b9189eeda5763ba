"""``recovery.bulk_action``: pause, resume, cancel or retry every job matching a Jobs filter.

A bulk action over a filter may touch 100,000 jobs: far too many for one web
request. The dashboard enqueues this durable operation instead, and the
browser follows its progress bar like any other job's. Unit = the next
``BATCH_SIZE`` matching job ids in id order, applied with
``durable.jobs.act``; checkpoint = the last id done. ``atomic_units``: the
jobs' new states and events commit with the checkpoint, so a worker killed
mid-way repeats nothing and skips nothing. A final unit records the audit
summary (applied / already so / refused) as a Recovery event.

Which jobs: those matching the filter *when their batch runs*, created no
later than the confirmation (``upto``, the largest id the user was shown), so
jobs created meanwhile are never touched — this job itself included. The job
acts as its owner, the dashboard user who confirmed it: if that user is gone
or no longer holds the permission when the job starts, it fails without
touching anything.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone

from durable import jobs as engine
from durable.errors import InputRejected, NonRetryable
from durable.models import Job, UnitResult
from durable.operations import Access, JobContext, Operation, Unit, register
from durable.states import Action
from recovery.records import record_event

from . import rollup
from .access import can_act
from .listing import job_filter

OPERATION = "recovery.bulk_action"
BATCH_SIZE = 500
FILTER_KEYS = ("q", "state", "operation", "error", "queue")
REPORT_KEY = "report"


def _owner(job_id: int) -> Any:
    owner = Job.objects.filter(pk=job_id).values_list("owner", flat=True).first() or ""
    return get_user_model().objects.filter(username=owner).first()


@register
class BulkAction(Operation):
    name = OPERATION
    label = "Bulk action on jobs"
    description = "Applies one action to every job matching a Jobs-page filter, in batches."
    access = Access.SYSTEM  # enqueued by the site itself, never from New job or the API
    atomic_units = True  # its only side effects are rows in this database
    max_attempts = 5
    backoff_base, backoff_max = 1.0, 60.0
    unit_timeout = 600.0

    def clean_input(self, data: dict[str, Any]) -> dict[str, Any]:
        action = data.get("action")
        if action not in {a.value for a in Action} | {engine.DISCARD}:
            raise InputRejected("action", "must be pause, resume, cancel, retry or discard")
        spec = data.get("filter")
        if not isinstance(spec, dict) or set(spec) - set(FILTER_KEYS):
            raise InputRejected("filter", f"must be an object with keys among {FILTER_KEYS}")
        if not all(isinstance(v, str) and len(v) <= 200 for v in spec.values()):
            raise InputRejected("filter", "values must be text of at most 200 characters")
        cleaned = {"action": action, "filter": spec}
        for name in ("upto", "expected"):
            value = data.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputRejected(name, "must be a whole number ≥ 0")
            cleaned[name] = value
        cleaned["user_id"] = data.get("user_id")
        cleaned["ip"] = str(data.get("ip") or "")[:64]
        return cleaned

    def prepare(self, ctx: JobContext) -> None:
        # The dashboard's rule, applied to the job's owner.
        user = _owner(ctx.job_id)
        if user is None or not can_act(user, ctx.input["action"]):
            raise NonRetryable(
                f"the job's owner may not {ctx.input['action']} jobs (no such staff user "
                "or no permission): nothing was changed"
            )

    def total_units(self, ctx: JobContext) -> int:
        return math.ceil(ctx.input["expected"] / BATCH_SIZE) + 1

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        checkpoint = ctx.checkpoint or {}
        if checkpoint.get("reported"):
            return
        after = int(checkpoint.get("after", 0))
        upto = ctx.input["upto"]
        while True:
            # Read after the previous batch committed: states are current.
            candidates = Job.objects.filter(pk__gt=after, pk__lte=upto).exclude(pk=ctx.job_id)
            ids = list(
                job_filter(candidates, ctx.input["filter"], timezone.now())
                .order_by("pk")
                .values_list("pk", flat=True)[:BATCH_SIZE]
            )
            if not ids:
                break
            yield Unit(key=f"after:{after}", payload={"ids": ids}, checkpoint={"after": ids[-1]})
            after = ids[-1]
        yield Unit(key=REPORT_KEY, checkpoint={"after": after, "reported": True})

    def run_unit(self, ctx: JobContext, unit: Unit) -> dict[str, Any]:
        if unit.key == REPORT_KEY:
            return self.report(ctx)
        owner = _owner(ctx.job_id)
        actor = owner.get_username() if owner is not None else ""
        if ctx.input["action"] == engine.DISCARD:  # finished jobs only, checked in the DELETE
            rollup.count_before_deleting()  # the throughput history keeps them
            outcomes = engine.discard(unit.payload["ids"])
        else:
            outcomes = engine.act(ctx.input["action"], unit.payload["ids"], actor=actor)
        refusals = Counter(o.refusal for o in outcomes if o.refused)
        return {
            "applied": sum(1 for o in outcomes if o.applied),
            "already": sum(1 for o in outcomes if not o.applied and not o.refused),
            "refused": sum(refusals.values()),
            "reasons": dict(refusals.most_common(3)),
        }

    def report(self, ctx: JobContext) -> dict[str, Any]:
        totals: Counter[str] = Counter()
        reasons: Counter[str] = Counter()
        for result in UnitResult.objects.filter(job_id=ctx.job_id).values_list("result", flat=True):
            if isinstance(result, dict) and "applied" in result:
                totals.update({k: result[k] for k in ("applied", "already", "refused")})
                reasons.update(result.get("reasons") or {})
        owner = _owner(ctx.job_id)
        action = ctx.input["action"]
        detail = (
            f"Bulk {action} (job {ctx.job_id}): {totals['applied']:,} applied, "
            f"{totals['already']:,} already so, {totals['refused']:,} refused"
        )
        if reasons:
            detail += " (" + "; ".join(f"{n:,} x {r}" for r, n in reasons.most_common(3)) + ")"
        record_event(
            "job-bulk-action",
            severity="warning" if totals["refused"] else "info",
            source="dashboard",
            detail=detail + ".",
            done=not totals["refused"],
            user_id=ctx.input.get("user_id") or "",
            username=owner.get_username() if owner is not None else "",
            ip=ctx.input.get("ip") or None,
            object_ids=[str(ctx.job_id)],
            object_titles=[OPERATION],
            job_id=ctx.job_id,
            operation=OPERATION,
            reason="; ".join(reasons) if reasons else "",
        )
        return dict(totals)
