"""The sampling harness: adaptive stopping, cheaper looks, and interleaved rounds."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tunectl.core.spec import MeasureSpec
from tunectl.measure.harness import cpu_sampler, interleave, measure, scaled
from tunectl.measure.timing import stack_sampler
from tunectl.tasks.cost_model import SIMULATED_ENV, CostModel


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


def test_a_measurements_seconds_leave_out_the_drift_guards_looks_between_its_chunks() -> None:
    """The guard's looks run between a measurement's chunks and are the guard's time: counted in the
    measurement too, a row's measuring time held them twice (the worker's measuring outran its span)."""
    clock, log = Clock(), []
    looks: list[float | None] = []

    def look(pace_s: float | None) -> None:
        looks.append(pace_s)
        clock.now += 0.05  # a look at the reference: 50 ms

    settings = MeasureSpec(warmup=0, min_samples=8, max_samples=8, noise_target=0.0, max_seconds=10.0)
    stats = measure(
        clock.sampler("a", log, us=1000.0), settings, lambda: clock.now, between=look, chunk_s=lambda: 0.003
    )
    assert stats.num_samples == 8 and len(looks) > 1
    assert stats.seconds == pytest.approx(8 * 1e-3), "the samples' 8 ms, none of the looks' 50 ms each"


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


def test_a_simulated_call_is_timed_by_the_cost_it_reports_alone_and_in_a_stack() -> None:
    calls: list[str] = []

    def call() -> None:
        calls.append("called")

    call.simulated_us = 250.0  # type: ignore[attr-defined]
    assert [cpu_sampler(call)() for _ in range(3)] == [250.0] * 3 and len(calls) == 3
    assert stack_sampler([call, call], "cpu", "eager")() == 500.0 and len(calls) == 5


def test_the_cost_model_reports_its_cost_when_simulated_and_sleeps_it_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    task, shape = CostModel(), {"batch": 8, "kv_len": 2048}
    config = task.complete_config({"fixed_ms": 0.5, "per_kv_ms": 0.25})
    inputs = task.build_inputs({"capacity": 1 << 20}, shape, "cpu")
    monkeypatch.setenv(SIMULATED_ENV, "1")
    call = task.prepare({"capacity": 1 << 20}, shape, config, inputs)
    assert call.simulated_us == 1000.0 and call() is inputs["x"]  # type: ignore[attr-defined]
    monkeypatch.delenv(SIMULATED_ENV)
    assert not hasattr(task.prepare({"capacity": 1 << 20}, shape, config, inputs), "simulated_us")
