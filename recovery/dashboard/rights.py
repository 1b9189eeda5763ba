"""Who may see and do what on the dashboard, decided from the permissions a user holds. Pure.

Every function takes the user's permissions as a set of ``"app_label.codename"``
strings (``User.get_all_permissions()``; a superuser holds every one), so the
whole table is tested without a database. Staff status is checked before any of
this (``access.staff_required``): these rules only refine what a staff user gets.

- **Looking** needs the model's ``view_`` permission (or its ``change_``, as in
  Django's admin): ``durable.view_job`` for Jobs and a job's page,
  ``recovery.view_recoveryevent`` for Recovery, ``recovery.view_securityevent``
  for Security, ``durable.view_schedule`` for Schedules. The Summary shows the
  sections the user may look at.
- **Acting** on jobs needs ``view_job`` and the action's permission
  (``pause_job`` for pause and resume, ``cancel_job``, ``retry_job``;
  ``change_job`` implies all three): "retry-only" is view + retry.
- **Discarding** finished jobs needs ``view_job`` and ``delete_job`` (not implied by
  ``change_job``: it deletes); **pausing a queue** needs ``view_job`` and ``pause_queue``.
- **Starting** jobs ("New job") needs ``view_job`` and ``add_job``; an
  operation marked ``Access.PRIVILEGED`` also needs ``start_privileged_job``, and
  one marked ``Access.SYSTEM`` is never started by hand.
- **Recording** a Recovery event needs ``view_recoveryevent`` and ``add_recoveryevent``.
- **Schedules**: ``add_schedule`` to create, ``change_schedule`` to enable or
  disable, ``delete_schedule`` to delete (each with ``view_schedule``); the
  schedule's operation obeys the same rule as "New job" for creating and enabling.
"""

from __future__ import annotations

from collections.abc import Set

from durable.operations import Access, Operation, may_start

VIEW_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "jobs": ("durable.view_job", "durable.change_job"),
    "recovery": ("recovery.view_recoveryevent", "recovery.change_recoveryevent"),
    "security": ("recovery.view_securityevent", "recovery.change_securityevent"),
    "schedules": ("durable.view_schedule", "durable.change_schedule"),
}
ACTION_PERMISSIONS = {
    "pause": "durable.pause_job",
    "resume": "durable.pause_job",
    "cancel": "durable.cancel_job",
    "retry": "durable.retry_job",
    # Deleting finished jobs: Django's own delete permission, never implied by change_job.
    "discard": "durable.delete_job",
}
UNIMPLIED_ACTIONS = frozenset({"discard"})
QUEUE_PERMISSION = "durable.pause_queue"  # pause and resume whole queues
CHANGE_PERMISSION = "durable.change_job"
ADD_PERMISSION = "durable.add_job"
PRIVILEGED_PERMISSION = "durable.start_privileged_job"
RECORD_PERMISSION = "recovery.add_recoveryevent"  # "Record event" on the Recovery page
SCHEDULE_PERMISSIONS = {
    "add": "durable.add_schedule",
    "enable": "durable.change_schedule",
    "disable": "durable.change_schedule",
    "delete": "durable.delete_schedule",
}

# Why an operation may not be started (or scheduled) by this user; None: it may.
SYSTEM_REFUSAL = "system"
PRIVILEGED_REFUSAL = "privileged"


def may_view(perms: Set[str], area: str) -> bool:
    """May look at ``area`` (jobs, recovery, security, schedules)."""
    return any(permission in perms for permission in VIEW_PERMISSIONS.get(area, ()))


def may_act(perms: Set[str], action: str) -> bool:
    """May apply ``action`` (pause, resume, cancel, retry) to jobs."""
    permission = ACTION_PERMISSIONS.get(action)
    if permission is None or not may_view(perms, "jobs"):
        return False
    if action in UNIMPLIED_ACTIONS:
        return permission in perms
    return permission in perms or CHANGE_PERMISSION in perms


def may_pause_queues(perms: Set[str]) -> bool:
    """May pause and resume queues (Queues page): ``pause_queue``, its own permission."""
    return may_view(perms, "jobs") and QUEUE_PERMISSION in perms


def may_add(perms: Set[str]) -> bool:
    """May open "New job" (which operations: ``start_refusal``)."""
    return may_view(perms, "jobs") and ADD_PERMISSION in perms


def may_record(perms: Set[str]) -> bool:
    return may_view(perms, "recovery") and RECORD_PERMISSION in perms


def may_change_schedules(perms: Set[str], change: str) -> bool:
    """May ``change`` (add, enable, disable, delete) schedules."""
    permission = SCHEDULE_PERMISSIONS.get(change)
    return permission is not None and may_view(perms, "schedules") and permission in perms


def start_refusal(perms: Set[str], operation: Operation) -> str | None:
    """Why this user may not start ``operation`` by hand (or schedule it), or None.

    The engine's own rule (``durable.operations.may_start``) decides; this names
    the reason for the message: the operation is the site's own, or it needs
    ``start_privileged_job``.
    """
    if may_start(operation, privileged=PRIVILEGED_PERMISSION in perms):
        return None
    # SYSTEM, or a marking may_start does not know: closed, as the site's own.
    return PRIVILEGED_REFUSAL if operation.access == Access.PRIVILEGED else SYSTEM_REFUSAL
