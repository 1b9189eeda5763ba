"""durable.wakeup.Wakeup: a wake-up is never lost and never wakes more than one thread."""

from __future__ import annotations

import threading
import time

from durable.wakeup import Wakeup


def test_a_signal_before_the_wait_is_kept_for_it():
    wakeup = Wakeup()
    wakeup.signal()  # arrived while the thread was still claiming
    started = time.monotonic()
    assert wakeup.wait(5.0) is True
    assert time.monotonic() - started < 1.0
    assert wakeup.wait(0.01) is False  # consumed: one token, not a stream


def test_one_signal_wakes_one_waiting_thread():
    wakeup = Wakeup()
    woken = []

    def waiter() -> None:
        woken.append(wakeup.wait(1.0))

    threads = [threading.Thread(target=waiter) for _ in range(3)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while wakeup.idle < 3 and time.monotonic() < deadline:
        time.sleep(0.001)
    wakeup.signal()
    for thread in threads:
        thread.join()
    assert sorted(woken) == [False, False, True]
    assert wakeup.idle == 0


def test_close_releases_every_waiting_thread_at_once():
    wakeup = Wakeup()
    threads = [threading.Thread(target=wakeup.wait, args=(30.0,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    started = time.monotonic()
    wakeup.close()
    for thread in threads:
        thread.join(5)
    assert not any(thread.is_alive() for thread in threads)
    assert time.monotonic() - started < 1.0
