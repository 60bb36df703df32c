"""The sampling harness: adaptive stopping, cheaper looks, and interleaved rounds."""

from __future__ import annotations

from collections.abc import Callable

from tunectl.core.spec import MeasureSpec
from tunectl.measure.harness import interleave, measure, scaled


class Clock:
    """A fake clock that each sample advances: timing stands in for the device, the logic is real."""

    def __init__(self) -> None:
        self.now = 0.0

    def sampler(self, name: str, log: list[str], us: float = 10.0) -> Callable[[], float]:
        def sample() -> float:
            self.now += us / 1e6
            log.append(name)
            return us

        return sample


def test_measure_stops_at_the_noise_target_after_the_minimum() -> None:
    clock, log = Clock(), []
    stats = measure(clock.sampler("a", log), MeasureSpec(warmup=2, min_samples=10), clock=lambda: clock.now)
    assert stats.num_samples == 10 and stats.rel_noise == 0.0 and len(log) == 12  # 2 warm-up calls


def test_a_screening_look_is_a_fraction_of_the_caps_with_at_least_three_samples() -> None:
    full = MeasureSpec(min_samples=10, max_samples=1000, max_seconds=2.0)
    cheap = scaled(full, 0.1)
    assert (cheap.min_samples, cheap.max_samples, cheap.max_seconds) == (3, 100, 0.2)
    assert scaled(full, 1.0) is full
    assert scaled(MeasureSpec(min_samples=2, max_samples=2), 0.01).min_samples == 2


def test_interleave_times_every_config_in_every_round_in_a_seeded_order() -> None:
    clock, log = Clock(), []
    samplers = [clock.sampler(n, log) for n in "abc"]
    settings = MeasureSpec(warmup=1, min_samples=6, max_samples=40, noise_target=0.0, max_seconds=10.0)
    rounds = interleave(samplers, 5, settings, seed=7, clock=lambda: clock.now)
    assert [len(r) for r in rounds] == [5, 5, 5]
    assert all(len(samples) >= 3 for r in rounds for samples in r)
    timed = log[3:]  # after one warm-up call each
    per_round = len(timed) // 5
    orders = ["".join(dict.fromkeys(timed[i * per_round : (i + 1) * per_round])) for i in range(5)]
    assert all(sorted(o) == ["a", "b", "c"] for o in orders)
    assert len(set(orders)) > 1, "the order changes between rounds"
    again, log2 = Clock(), []
    interleave([again.sampler(n, log2) for n in "abc"], 5, settings, seed=7, clock=lambda: again.now)
    assert log2 == log, "the same seed gives the same order"
