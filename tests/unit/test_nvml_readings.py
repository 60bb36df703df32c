"""The NVML readings and the GPU samplers' logic, on CPU (the real thing on a GPU:
tests/gpu/test_gpu_harness.py)."""

from __future__ import annotations

import threading

import pytest

from tunectl.measure import nvml, timing
from tunectl.measure.nvml import GpuState


def _state(reasons: int | None = 0, violation_ns: int | None = 0, temp: float = 40.0) -> GpuState:
    return GpuState(
        sm_clock_mhz=1980.0,
        temperature_c=temp,
        power_w=400.0,
        throttle_reasons=reasons,
        violation_ns=violation_ns,
    )


def test_a_measurement_without_slowdown_is_not_flagged() -> None:
    idle = 0x1  # a reason bit that is not a slowdown
    state = nvml.state_around(_state(temp=41.0), _state(reasons=idle, temp=45.0))
    assert state == nvml.DeviceState(
        sm_clock_mhz=1980.0, temperature_c=45.0, power_w=400.0, throttled=False, throttle_reasons=idle
    )


@pytest.mark.parametrize("reason", [0x4, 0x8, 0x20, 0x40, 0x80])
def test_a_slowdown_reason_at_either_end_flags_the_measurement(reason: int) -> None:
    for before, after in ((_state(reasons=reason), _state()), (_state(), _state(reasons=reason))):
        state = nvml.state_around(before, after)
        assert state is not None and state.throttled is True
    both = nvml.state_around(_state(reasons=reason), _state(reasons=0x1))
    assert both is not None and both.throttle_reasons == reason | 0x1


def test_violation_time_that_grew_during_the_samples_flags_the_measurement() -> None:
    assert nvml.is_throttled(_state(violation_ns=10), _state(violation_ns=11)) is True
    assert nvml.is_throttled(_state(violation_ns=10), _state(violation_ns=10)) is False


def test_nothing_read_means_nothing_recorded() -> None:
    assert nvml.state_around(None, None) is None
    assert nvml.is_throttled(_state(None, None), _state(None, None)) is None
    assert nvml.read_state("cpu") is None


def test_a_reading_is_taken_on_a_thread_of_its_own_while_the_caller_measures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    measuring = threading.Event()
    seen: dict[str, object] = {}

    def slow_read(device: str) -> GpuState:  # NVML waiting for the driver
        seen["thread"] = threading.current_thread() is not threading.main_thread()
        seen["while_measuring"] = measuring.wait(timeout=5)
        return _state(violation_ns=7)

    monkeypatch.setattr(nvml, "read_state", slow_read)
    reading = nvml.read_during("cuda:0")
    measuring.set()  # the caller's samples, timed while the reading is under way
    assert reading.result(timeout=5) == _state(violation_ns=7)
    assert seen == {"thread": True, "while_measuring": True}
    assert nvml.read_during("cpu").result(timeout=0) is None


def test_graph_replay_needs_cuda_and_modes_are_checked() -> None:
    with pytest.raises(ValueError, match="CUDA"):
        timing.make_sampler(lambda: None, "cpu", "graph", "warm")
    with pytest.raises(ValueError, match="mode"):
        timing.make_sampler(lambda: None, "cpu", "stacked", "warm")


def test_a_warm_replay_repeats_short_calls_up_to_the_target() -> None:
    assert timing._reps_for(1000.0) == 1
    assert timing._reps_for(10.0) == 20
    assert timing._reps_for(0.1) == timing._GRAPH_MAX_REPS
    assert timing._reps_for(0.0) == timing._GRAPH_MAX_REPS
