"""The dashboard's permission table (``recovery.dashboard.rights``): pure, no database."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from durable.operations import Access
from recovery.dashboard import rights

VIEW_JOB = "durable.view_job"
PRIVILEGED = "durable.start_privileged_job"


@pytest.mark.parametrize(
    ("perms", "area", "expected"),
    [
        (set(), "jobs", False),  # staff with nothing sees nothing
        ({VIEW_JOB}, "jobs", True),
        ({"durable.change_job"}, "jobs", True),  # change implies view, as in Django's admin
        ({VIEW_JOB}, "recovery", False),  # one area does not open another
        ({"recovery.view_recoveryevent"}, "recovery", True),
        ({"recovery.view_recoveryevent"}, "security", False),
        ({"recovery.view_securityevent"}, "security", True),
        ({"durable.view_schedule"}, "schedules", True),
        ({"durable.add_schedule"}, "schedules", False),  # adding is not looking
        ({VIEW_JOB}, "nonsense", False),  # an unknown area is closed
    ],
)
def test_may_view(perms, area, expected):
    assert rights.may_view(perms, area) is expected


@pytest.mark.parametrize(
    ("perms", "action", "expected"),
    [
        ({VIEW_JOB, "durable.pause_job"}, "pause", True),
        ({VIEW_JOB, "durable.pause_job"}, "resume", True),  # one right for both
        ({VIEW_JOB, "durable.pause_job"}, "cancel", False),
        ({VIEW_JOB, "durable.retry_job"}, "retry", True),  # "retry-only"
        ({"durable.retry_job"}, "retry", False),  # the right without looking: no
        ({"durable.change_job"}, "cancel", True),  # change: all of them, and looking
        ({VIEW_JOB}, "pause", False),  # look-only
        ({VIEW_JOB, "durable.pause_job"}, "explode", False),  # not an action
    ],
)
def test_may_act(perms, action, expected):
    assert rights.may_act(perms, action) is expected


@pytest.mark.parametrize(
    ("perms", "expected"),
    [({VIEW_JOB, "durable.add_job"}, True), ({"durable.add_job"}, False), ({VIEW_JOB}, False)],
)
def test_may_add(perms, expected):
    assert rights.may_add(perms) is expected


@pytest.mark.parametrize(
    ("perms", "expected"),
    [({"recovery.view_recoveryevent", "recovery.add_recoveryevent"}, True),
     ({"recovery.add_recoveryevent"}, False), ({"recovery.view_recoveryevent"}, False)],
)  # fmt: skip
def test_may_record(perms, expected):
    assert rights.may_record(perms) is expected


@pytest.mark.parametrize(
    ("perms", "change", "expected"),
    [
        ({"durable.view_schedule", "durable.add_schedule"}, "add", True),
        ({"durable.add_schedule"}, "add", False),  # needs to see the list too
        ({"durable.view_schedule", "durable.change_schedule"}, "enable", True),
        ({"durable.view_schedule", "durable.change_schedule"}, "disable", True),
        ({"durable.view_schedule", "durable.change_schedule"}, "delete", False),
        ({"durable.view_schedule", "durable.delete_schedule"}, "delete", True),
        ({"durable.view_schedule", "durable.delete_schedule"}, "rename", False),
    ],
)
def test_may_change_schedules(perms, change, expected):
    assert rights.may_change_schedules(perms, change) is expected


@pytest.mark.parametrize(
    ("access", "perms", "expected"),
    [
        (Access.ANYONE, set(), None),
        (Access.PRIVILEGED, set(), rights.PRIVILEGED_REFUSAL),
        (Access.PRIVILEGED, {PRIVILEGED}, None),
        (Access.SYSTEM, set(), rights.SYSTEM_REFUSAL),
        (Access.SYSTEM, {PRIVILEGED}, rights.SYSTEM_REFUSAL),  # never by hand, whoever asks
        ("mystery", {PRIVILEGED}, rights.SYSTEM_REFUSAL),  # an unknown marking stays closed
    ],
)
def test_start_refusal(access, perms, expected):
    assert rights.start_refusal(perms, SimpleNamespace(access=access)) == expected
