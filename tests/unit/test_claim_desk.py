"""durable.worker.ClaimDesk: threads that want a job at the same moment share one claim.

The claim itself is a plain function here (the database's side is tested in
tests/integration/test_small_jobs.py); what is tested is who gets what, and
that no thread is ever left waiting.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import pytest

from durable.worker import ClaimDesk, ClaimFailed


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


class Queue:
    """A claim over ``due`` jobs (numbers); ``gate`` holds the first claim until set."""

    def __init__(self, due: int, *, hold_first: bool = False, fail: tuple[int, ...] = ()) -> None:
        self.numbers = itertools.count(1)
        self.due = due
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.inside = threading.Event()
        if not hold_first:
            self.gate.set()
        self.fail = fail  # which calls (1 = the first) raise

    def claim(self, count: int) -> list:
        self.calls.append(count)
        if len(self.calls) == 1:
            self.inside.set()
            assert self.gate.wait(5)
        if len(self.calls) in self.fail:
            raise RuntimeError("database went away")
        taken = min(count, self.due)
        self.due -= taken
        return [next(self.numbers) for _ in range(taken)]


def take_in_threads(desk: ClaimDesk, n: int) -> tuple[list[threading.Thread], list]:
    got: list = []

    def take() -> None:
        try:
            got.append(desk.take())
        except Exception as exc:
            got.append(exc)

    threads = [threading.Thread(target=take) for _ in range(n)]
    for thread in threads:
        thread.start()
    return threads, got


def seated_during_first_claim(desk: ClaimDesk, queue: Queue, n: int) -> tuple[list, list]:
    """One thread claims (held at the gate) while ``n`` more take seats; then all go on.

    Returns (what the first thread got, what the seated threads got), once
    every thread has its answer.
    """
    leader, first = take_in_threads(desk, 1)
    assert queue.inside.wait(5)
    followers, got = take_in_threads(desk, n)
    wait_for(lambda: desk.waiting == n)
    queue.gate.set()
    for thread in leader + followers:
        thread.join(5)
        assert not thread.is_alive()  # nobody left waiting for an answer
    return first, got


def test_a_thread_alone_claims_one_job():
    queue = Queue(due=5)
    desk = ClaimDesk(queue.claim, limit=8)
    assert desk.take() == 1
    assert desk.take() == 2
    assert queue.calls == [1, 1]
    assert (desk.claims, desk.served, desk.waiting) == (2, 2, 0)


def test_threads_seated_during_a_claim_share_the_next_one():
    queue = Queue(due=10, hold_first=True)
    desk = ClaimDesk(queue.claim, limit=8)
    first, got = seated_during_first_claim(desk, queue, 3)
    assert first == [1]
    assert sorted(got) == [2, 3, 4]  # every thread its own job
    assert queue.calls == [1, 3]  # one claim for the three that waited together
    assert (desk.claims, desk.served, desk.waiting) == (2, 4, 0)


def test_a_claim_takes_at_most_limit_jobs():
    queue = Queue(due=10, hold_first=True)
    desk = ClaimDesk(queue.claim, limit=2)
    _, got = seated_during_first_claim(desk, queue, 5)
    assert queue.calls == [1, 2, 2, 1]
    assert sorted(got) == [2, 3, 4, 5, 6]


def test_seats_beyond_the_due_jobs_are_told_nothing_is_due():
    queue = Queue(due=3, hold_first=True)
    desk = ClaimDesk(queue.claim, limit=8)
    first, got = seated_during_first_claim(desk, queue, 4)
    assert first == [1]
    assert sorted(got, key=lambda value: (value is None, value)) == [2, 3, None, None]
    assert queue.due == 0  # nothing claimed that no thread got


def test_a_failed_claim_of_the_leader_is_raised_to_it_and_the_seated_are_served_next():
    queue = Queue(due=10, hold_first=True, fail=(1,))
    desk = ClaimDesk(queue.claim, limit=8)
    first, got = seated_during_first_claim(desk, queue, 2)
    assert isinstance(first[0], RuntimeError)
    assert sorted(got) == [1, 2]  # the next claim, by one of them, worked
    assert queue.calls == [1, 2]


def test_a_failed_shared_claim_answers_every_seat_and_the_desk_goes_on():
    queue = Queue(due=10, hold_first=True, fail=(2,))
    desk = ClaimDesk(queue.claim, limit=8)
    first, got = seated_during_first_claim(desk, queue, 2)
    assert first == [1]
    assert len(got) == 2
    # The thread that led the failed claim gets its error; the other learns
    # that the claim made for it failed, and why.
    raised = sorted(got, key=lambda exc: type(exc).__name__)
    assert type(raised[0]) is ClaimFailed
    assert str(raised[0].__cause__) == "database went away"
    assert type(raised[1]) is RuntimeError
    assert desk.take() == 2  # the next thread is served as usual
    assert desk.waiting == 0


@pytest.mark.parametrize("limit", [1, 3, 16])
def test_many_threads_many_rounds_every_job_to_exactly_one_thread(limit):
    queue = Queue(due=2000)
    desk = ClaimDesk(queue.claim, limit=limit)
    got: list = []
    lock = threading.Lock()

    def worker() -> None:
        while (job := desk.take()) is not None:
            with lock:
                got.append(job)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()
    assert sorted(got) == list(range(1, 2001))
    assert max(queue.calls) <= limit
    assert desk.waiting == 0
