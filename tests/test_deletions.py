"""The controller's deletion timers (controller/deletions.py)."""

from __future__ import annotations

from gpuscale.controller.deletions import Deletions


def test_retry_times_and_orphan_clocks_give_the_wake_times() -> None:
    d = Deletions(orphan_grace_s=60.0)
    assert d.wake_times() == []
    d.retry("a", 10.0)
    d.retry("b", 30.0)
    d.retry("a", 20.0)  # a later check replaces the earlier one
    d.orphans({"node-1": 100.0})
    assert sorted(d.wake_times()) == [20.0, 30.0, 160.0]
    d.forget("a")
    d.forget("never-there")
    d.orphans({})
    assert d.wake_times() == [30.0]


def test_the_orphan_clocks_are_a_copy_of_the_scan() -> None:
    scan = {"node-1": 5.0}
    d = Deletions(orphan_grace_s=1.0)
    d.orphans(scan)
    scan["node-2"] = 6.0
    assert d.orphan_since == {"node-1": 5.0}
