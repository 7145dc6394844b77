"""The discrete-event engine, its clock, random streams and distributions."""

from __future__ import annotations

import statistics

import pytest

from gpuscale.errors import InputError
from gpuscale.sim.engine import Dist, Engine, stream


def test_events_run_in_time_order_and_ties_in_schedule_order() -> None:
    eng = Engine()
    seen: list[tuple[float, str]] = []
    for t, name in ((5.0, "c"), (1.0, "a"), (5.0, "d"), (3.0, "b")):
        eng.at(t, lambda n=name: seen.append((eng.now(), n)))
    assert eng.run_until(10.0) == 4
    assert seen == [(1.0, "a"), (3.0, "b"), (5.0, "c"), (5.0, "d")]
    assert eng.now() == 10.0


def test_run_until_exclusive_leaves_events_due_at_the_limit() -> None:
    eng = Engine()
    seen: list[str] = []
    eng.at(2.0, seen.append, "x")
    eng.run_until(2.0, inclusive=False)
    assert seen == [] and eng.peek() == 2.0
    eng.run_until(2.0)
    assert seen == ["x"] and eng.peek() is None


def test_cancelled_events_do_not_run_and_callbacks_can_schedule_more() -> None:
    eng = Engine()
    seen: list[str] = []
    timer = eng.at(1.0, seen.append, "cancelled")
    timer.cancel()

    def chain(n: int) -> None:
        seen.append(f"chain{n}")
        if n < 3:
            eng.after(10.0, chain, n + 1)

    eng.at(0.5, chain, 1)
    assert eng.run_next_instant() == 0.5
    eng.run_until(100.0)
    assert seen == ["chain1", "chain2", "chain3"]
    assert eng.now() == 100.0


def test_past_events_are_clamped_to_now_and_clock_never_goes_back() -> None:
    eng = Engine(start=50.0)
    seen: list[float] = []
    eng.at(10.0, lambda: seen.append(eng.now()))
    eng.clock.advance_to(20.0)
    assert eng.now() == 50.0
    eng.run_until(60.0)
    assert seen == [50.0]
    eng.clock.sleep(5.0)
    assert eng.now() == 65.0


def test_streams_are_reproducible_and_independent() -> None:
    a = [stream(7, "x").random() for _ in range(3)]
    b = [stream(7, "x").random() for _ in range(3)]
    assert a == b
    assert stream(7, "x").random() != stream(7, "y").random()
    assert stream(7, "x").random() != stream(8, "x").random()


def test_distributions_sample_their_shapes() -> None:
    rng = stream(1, "dist")
    assert Dist.const(4.0).sample(rng) == 4.0
    uni = [Dist("uniform", 10, 20).sample(rng) for _ in range(2000)]
    assert min(uni) >= 10 and max(uni) <= 20
    logn = [Dist("lognormal", 60, 0.3).sample(rng) for _ in range(4000)]
    assert statistics.median(logn) == pytest.approx(60, rel=0.05)
    expo = [Dist("exponential", 100).sample(rng) for _ in range(4000)]
    assert statistics.fmean(expo) == pytest.approx(100, rel=0.07)
    norm = [Dist("normal", 5, 10).sample(rng) for _ in range(500)]
    assert min(norm) >= 0.0  # clipped
    assert Dist("lognormal", 60, 0.3).mean == pytest.approx(60 * 1.046, rel=0.01)


@pytest.mark.parametrize(("kind", "a", "b"), [("weibull", 1, 1), ("uniform", 5, 1), ("constant", -1, 0)])
def test_bad_distributions_are_input_errors(kind: str, a: float, b: float) -> None:
    with pytest.raises(InputError):
        Dist(kind, a, b)
