"""The batch window of pending pods (controller.batching)."""

from __future__ import annotations

from gpuscale.controller.batching import PendingBatch


def test_a_batch_closes_after_the_idle_time_or_the_maximum() -> None:
    b = PendingBatch(idle_s=1.0, max_s=10.0)
    assert b.update([], 0.0) and b.wake_time() is None  # nothing pending: no batch
    assert not b.update(["a"], 0.1)  # a new pod opens a batch
    assert b.wake_time() == 1.1
    assert not b.update(["a", "b"], 0.5)  # another new pod extends it
    assert b.wake_time() == 1.5
    assert not b.update(["a", "b"], 1.4)  # no new pod, not idle long enough
    assert b.update(["a", "b"], 1.5)
    b.close()
    assert b.update(["a", "b"], 1.6)  # the same pods again open nothing
    for i in range(30):  # a new pod every 0.5 s keeps it open at most max_s
        closed = b.update([f"p{j}" for j in range(i + 1)], 2.0 + 0.5 * i)
        if closed:
            break
    assert b.start == 2.0 and 2.0 + 0.5 * i == 12.0


def test_a_pod_that_left_and_came_back_is_new_again() -> None:
    b = PendingBatch(idle_s=1.0, max_s=10.0)
    b.update(["a"], 0.0)
    b.update(["a"], 5.0)
    b.close()
    b.update([], 6.0)
    assert not b.update(["a"], 7.0)  # pending again (say, evicted): a new batch
