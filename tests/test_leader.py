"""Leader election, the core's decisions: tables and a property (never two leaders). The Lease side over real HTTP is
tested in tests/test_leader_kube.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.core.leader import (
    ElectionConfig,
    LeaseRecord,
    LeaseStep,
    Observation,
    desired,
    expired,
    next_step,
    observe,
    released,
    should_act,
)

CFG = ElectionConfig(lease_duration_s=15, renew_deadline_s=10, retry_period_s=2)
HELD_BY_B = LeaseRecord("b", 15, 100, 100, 3)


# ------------------------------------------------------------------------------------------------------ the core
@pytest.mark.parametrize(
    ("obs", "now", "step"),
    [
        (None, 0, LeaseStep.CREATE),
        (Observation(LeaseRecord("a", 15, 100, 100, 0), 100), 200, LeaseStep.RENEW),  # mine, even when old
        (Observation(HELD_BY_B, 100), 100, LeaseStep.WAIT),
        (Observation(HELD_BY_B, 100), 114.9, LeaseStep.WAIT),
        (Observation(HELD_BY_B, 100), 115, LeaseStep.TAKE_OVER),  # unchanged for its duration
        (Observation(LeaseRecord("", 1, 100, 100, 3), 100), 100, LeaseStep.TAKE_OVER),  # released
        (Observation(LeaseRecord("b", 60, 0, 0, 0), 100), 150, LeaseStep.WAIT),  # the lease's own duration counts
    ],
)
def test_next_step(obs: Observation | None, now: float, step: LeaseStep) -> None:
    assert next_step(obs, "a", now) is step


def test_expiry_follows_the_local_observation_not_the_remote_renew_time() -> None:
    # b's clock is an hour behind: its renewTime looks ancient, but the record keeps changing, so b keeps the lease.
    first = observe(None, LeaseRecord("b", 15, 0, 1000, 0), now=5000)
    assert first is not None and not expired(first, 5010)
    again = observe(first, LeaseRecord("b", 15, 0, 1000, 0), now=5014)
    assert again is first  # nothing changed: changed_at stays
    renewed = observe(again, LeaseRecord("b", 15, 0, 1002, 0), now=5016)
    assert renewed is not None and renewed.changed_at == 5016 and next_step(renewed, "a", 5030) is LeaseStep.WAIT
    assert next_step(renewed, "a", 5031) is LeaseStep.TAKE_OVER
    assert observe(renewed, None, 5040) is None


@pytest.mark.parametrize(
    ("step", "want"),
    [
        (LeaseStep.CREATE, LeaseRecord("a", 15, 200, 200, 0)),
        (LeaseStep.RENEW, LeaseRecord("b", 15, 100, 200, 3)),  # renewing keeps holder, acquire time, transitions
        (LeaseStep.TAKE_OVER, LeaseRecord("a", 15, 200, 200, 4)),
        (LeaseStep.WAIT, None),
    ],
)
def test_desired_record(step: LeaseStep, want: LeaseRecord | None) -> None:
    obs = None if step is LeaseStep.CREATE else Observation(HELD_BY_B, 100)
    assert desired(obs, step, "a", 200, CFG) == want


def test_release_and_should_act() -> None:
    assert released(HELD_BY_B, "a") is None
    assert released(HELD_BY_B, "b") == LeaseRecord("", 1, 100, 100, 3)
    assert not should_act(None, 0, CFG)
    assert should_act(100, 109.9, CFG) and not should_act(100, 110, CFG)
    assert CFG.problem() is None
    assert ElectionConfig(10, 10, 2).problem() is not None and ElectionConfig(15, 10, 0).problem() is not None


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.floats(0.1, 9.0), st.booleans()), min_size=1, max_size=60))
def test_never_two_leaders(rounds: list[tuple[int, float, bool]]) -> None:
    """Three replicas over one compare-and-swap store; each round one replica reads and (unless partitioned, when its
    write is lost) writes. At every instant at most one replica may act."""
    store: dict[str, object] = {"record": None, "version": 0}
    obs: list[Observation | None] = [None, None, None]
    renewed: list[float | None] = [None, None, None]
    now = 0.0
    for who, gap, partitioned in rounds:
        now += gap
        me = "abc"[who]
        read_version = store["version"]
        record = store["record"]
        assert record is None or isinstance(record, LeaseRecord)
        obs[who] = observe(obs[who], record, now)
        step = next_step(obs[who], me, now)
        new = desired(obs[who], step, me, now, CFG)
        if new is None:
            renewed[who] = None
        elif not partitioned and store["version"] == read_version:
            store["record"], store["version"] = new, read_version + 1  # type: ignore[operator]
            obs[who] = Observation(new, now)
            renewed[who] = now
        leaders = [i for i in range(3) if should_act(renewed[i], now, CFG)]
        assert len(leaders) <= 1, (now, leaders, store)
        # also between rounds: the one who may act is the holder of the stored record
        for i in leaders:
            stored = store["record"]
            assert isinstance(stored, LeaseRecord) and stored.holder == "abc"[i]
