import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable.operations import Access, Operation, may_start
from durable.policy import (
    MAX_ERROR_HISTORY,
    MAX_ERROR_MESSAGE_BYTES,
    append_bounded,
    backoff_delay,
    deaths_without_progress,
    error_entry,
    parse_duration,
    reclaim_delay,
    redact,
    truncate_utf8,
    worker_alive,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@given(
    attempt=st.integers(min_value=1, max_value=10_000),
    base=st.floats(min_value=0, max_value=100),
    cap=st.floats(min_value=0, max_value=10_000),
    seed=st.integers(),
)
def test_backoff_delay__always_within_zero_and_the_capped_exponential(attempt, base, cap, seed):
    delay = backoff_delay(attempt, base=base, cap=cap, rng=random.Random(seed))
    assert 0 <= delay <= min(cap, base * 2 ** min(attempt - 1, 62))


def test_backoff_delay__is_jittered_not_constant():
    rng = random.Random(7)
    delays = {round(backoff_delay(5, base=1, cap=60, rng=rng), 6) for _ in range(200)}
    assert len(delays) > 150
    # Full jitter spreads over the whole window, not a thin band near the top.
    assert min(delays) < 16 * 0.2
    assert max(delays) > 16 * 0.8


def test_backoff_delay__grows_until_the_cap():
    ceilings = [
        max(backoff_delay(n, base=1, cap=30, rng=random.Random(s)) for s in range(300))
        for n in (1, 3, 10)
    ]
    assert ceilings[0] <= 1
    assert 2 < ceilings[1] <= 4
    assert 25 < ceilings[2] <= 30


def test_backoff_delay__rejects_attempt_zero():
    with pytest.raises(ValueError, match="counts from 1"):
        backoff_delay(0, base=1, cap=1)


@pytest.mark.parametrize(
    ("text", "limit", "fits"),
    [
        ("short", 100, True),
        ("x" * 5000, 2048, False),
        ("é" * 3000, 2048, False),  # two bytes each: the cut must not split one
        ("🙂" * 1000, 2048, False),
    ],
)
def test_truncate_utf8__bounded_in_bytes_and_still_valid_text(text, limit, fits):
    out = truncate_utf8(text, limit)
    assert len(out.encode()) <= limit
    assert (out == text) is fits
    out.encode("utf-8")  # would raise on a split surrogate


def test_truncate_utf8__tail_keeps_the_end():
    assert truncate_utf8("a" * 100 + "END", 50, keep="tail").endswith("END")


def test_error_entry__bounded_and_secret_free():
    secret = "s3cr3t-value-xyz"
    exc = RuntimeError(f"upstream rejected {secret} " + "x" * 10_000)
    entry = error_entry(exc, attempt=2, retryable=True, now=NOW, secrets=frozenset({secret}))
    assert entry["error_class"] == "RuntimeError"
    assert entry["attempt"] == 2
    assert entry["retryable"] is True
    assert len(entry["message"].encode()) <= MAX_ERROR_MESSAGE_BYTES
    assert secret not in entry["message"]
    assert secret not in entry["traceback"]
    assert "[redacted]" in entry["message"]


def test_error_entry__names_non_builtin_classes_with_their_module():
    class ProviderDown(Exception):
        pass

    entry = error_entry(ProviderDown(), attempt=1, retryable=True, now=NOW)
    assert entry["error_class"].endswith("ProviderDown")
    assert "." in entry["error_class"]
    assert entry["message"]  # an empty message falls back to the class name


def test_append_bounded__keeps_the_newest():
    history = []
    for n in range(25):
        history = append_bounded(history, {"n": n})
    assert len(history) == MAX_ERROR_HISTORY
    assert history[0]["n"] == 5
    assert history[-1]["n"] == 24


def test_redact__ignores_values_too_short_to_be_secrets():
    assert redact("a bc abc", {"bc"}) == "a bc abc"
    assert redact("token=abcdef", {"abcdef"}) == "token=[redacted]"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("15m", timedelta(minutes=15)),
        ("90s", timedelta(seconds=90)),
        ("2w", timedelta(weeks=2)),
        ("45", timedelta(seconds=45)),  # bare seconds
        (" 7D ", timedelta(days=7)),
    ],
)
def test_parse_duration__accepted_forms(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "d", "-1d", "1.5d", "30x", "30 days"])
def test_parse_duration__rejects_garbage_with_a_hint(text):
    with pytest.raises(ValueError, match=r"e\.g\. 30d"):
        parse_duration(text)


class _Op(Operation):
    name = "t.access"


@pytest.mark.parametrize(
    ("access", "privileged", "allowed"),
    [
        (Access.ANYONE, False, True),  # the default: anyone who may start jobs
        (Access.ANYONE, True, True),
        (Access.PRIVILEGED, False, False),  # needs the extra right
        (Access.PRIVILEGED, True, True),
        (Access.SYSTEM, False, False),  # never by hand, whoever asks
        (Access.SYSTEM, True, False),
        ("mystery", True, False),  # a marking this code does not know: closed, as the dashboard
        ("", True, False),
    ],
)
def test_may_start__table(access: str, privileged: bool, allowed: bool):
    op = _Op()
    op.access = access
    assert may_start(op, privileged=privileged) is allowed


@pytest.mark.parametrize(
    ("silent_for", "lease_seconds", "alive"),
    [
        (0, 30, True),  # just beat
        (20, 90, True),  # a 90 s-lease peer beats every 30 s: 20 s of silence is normal
        (21, 10, False),  # a 10 s-lease peer beats every 3.3 s: over two leases silent
        (59, 30, True),  # one late beat is tolerated: the margin is a whole extra lease
        (61, 30, False),
        (1, 0.3, False),  # short test leases shrink the window with them
    ],
)
def test_worker_alive__judged_by_the_worker_s_own_lease(silent_for, lease_seconds, alive):
    heartbeat_at = NOW - timedelta(seconds=silent_for)
    assert worker_alive(heartbeat_at=heartbeat_at, lease_seconds=lease_seconds, now=NOW) is alive


@pytest.mark.parametrize(
    ("position", "ceiling"),
    [
        (0, 0.0),  # the first job taken back is due at once
        (1, 0.1),
        (10, 1.0),  # the spread grows with the number taken back in the round
        (10_000, 30.0),  # capped: even a huge backlog starts within 30 s
    ],
)
def test_reclaim_delay__spreads_jobs_with_jitter_within_a_cap(position, ceiling):
    rng = random.Random(7)
    delays = [reclaim_delay(position, rng=rng) for _ in range(200)]
    assert all(0.0 <= delay <= ceiling for delay in delays)
    if ceiling:
        assert max(delays) > ceiling / 2  # jittered over the range, not one instant


def test_reclaim_delay__refuses_a_negative_position():
    with pytest.raises(ValueError, match="from 0"):
        reclaim_delay(-1)


def _lost(spent: bool | None) -> dict:
    entry = {"error_class": "WorkerLost", "message": "worker w stopped"}
    if spent is not None:
        entry["attempt_spent"] = spent
    return entry


RAISED = {"error_class": "builtins.RuntimeError", "message": "boom"}


@pytest.mark.parametrize(
    ("history", "attempts", "deaths"),
    [
        ([_lost(True)] * 5, 5, 5),  # the job crashed its worker five times
        ([_lost(False)] * 9 + [_lost(True)] * 3, 3, 3),  # progress deaths are not counted
        ([_lost(True), RAISED, _lost(False), _lost(True)], 3, 2),  # one attempt was an error
        ([_lost(True)] * 4 + [_lost(True)], 2, 2),  # only the current budget of attempts
        ([_lost(None)] * 2, 2, 2),  # an older release's entry: spent
        ([], 0, 0),
    ],
)
def test_deaths_without_progress__counts_spent_worker_deaths_among_the_last_attempts(
    history, attempts, deaths
):
    assert deaths_without_progress(history, attempts) == deaths
