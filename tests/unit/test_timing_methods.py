"""Timing methods on a fake device: the difference method recovers a call's time, replay reads it high.

The fake stands in for the GPU and its clock only: each kernel advances the device clock by its
cost, and each timed launch pays a fixed overhead once. The samplers, the harness and the
statistics are the real ones.
"""

from __future__ import annotations

import gc
import random
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from tunectl.core.record import Timing
from tunectl.core.spec import MeasureSpec
from tunectl.measure.difference import MAX_CALLS, difference_sampler, num_calls_for, replay_sampler
from tunectl.measure.harness import measure
from tunectl.measure.timing import make_sampler, timing_of

SETTINGS = MeasureSpec(warmup=1, min_samples=20, max_samples=400, noise_target=0.002, max_seconds=10.0)


class FakeGpu:
    """A device clock: a call costs ``call_us``, a flush ``flush_us``; a timed launch pays ``overhead_us``
    (drawn from ``jitter_us`` either side) once, as events and a graph launch do."""

    def __init__(
        self, *, call_us: float, flush_us: float, overhead_us: float, jitter_us: float = 0.0
    ) -> None:
        self.call_us, self.flush_us = call_us, flush_us
        self.overhead_us, self.jitter_us = overhead_us, jitter_us
        self.now_us = 0.0
        self.slowdown = 1.0  # every kernel takes this many times its cost
        self.rng = random.Random(7)

    def call(self) -> None:
        self.now_us += self.call_us * self.slowdown

    def flush(self) -> None:
        self.now_us += self.flush_us * self.slowdown

    def timer(self, launch: Callable[[], Any]) -> float:
        start = self.now_us
        self.now_us += self.overhead_us + self.rng.uniform(-self.jitter_us, self.jitter_us)
        launch()
        return self.now_us - start

    @staticmethod
    def capture(fn: Callable[[], Any]) -> Callable[[], Any]:
        """One launch of ``fn`` (a graph on the device)."""
        return fn


class Memory:
    """Device memory a kernel reads or writes, owned by the callable that allocated it."""


class GraphGpu:
    """A device under CUDA graphs: a kernel launched while capturing is recorded with the memory it
    uses, and a replay runs the recorded kernels again on that memory while owning none of it, as a
    graph holds addresses and not the tensors behind them. A replayed kernel whose memory was freed
    fails: on the device that memory has gone to the next tensor made, and the replay reads its bytes
    (as page indices: the gather's index-out-of-bounds assert) or writes over them."""

    def __init__(self) -> None:
        self.now_us = 0.0
        self.recording: list[tuple[weakref.ref[Memory], float]] | None = None

    def kernel(self, us: float) -> Callable[[], None]:
        """A call that allocated its memory when it was made (a page-table copy, an output, a workspace)."""
        memory = Memory()

        def call() -> None:
            if self.recording is not None:
                self.recording.append((weakref.ref(memory), us))
            else:
                self.now_us += us

        return call

    def capture(self, fn: Callable[[], Any]) -> Callable[[], None]:
        self.recording = []
        fn()
        kernels, self.recording = self.recording, None

        def replay() -> None:
            for memory, us in kernels:
                if memory() is None:
                    raise RuntimeError("a replayed kernel used memory that was freed after the capture")
                self.now_us += us

        return replay

    def timer(self, launch: Callable[[], Any]) -> float:
        start = self.now_us
        launch()
        return self.now_us - start


@pytest.mark.parametrize("method", ["difference", "replay"])
def test_a_sampler_keeps_alive_the_memory_its_captured_launches_use(method: str) -> None:
    # A comparison keeps each arm's sampler and drops the arm's call before timing them all; nothing
    # but the sampler holds the call and the flush here either.
    gpu = GraphGpu()
    if method == "difference":
        sample = difference_sampler(
            gpu.kernel(10.0), gpu.kernel(30.0), num_calls=4, timer=gpu.timer, capture=gpu.capture
        )
    else:
        sample = replay_sampler(gpu.kernel(10.0), gpu.kernel(30.0), timer=gpu.timer, capture=gpu.capture)
    gc.collect()
    assert [sample() for _ in range(3)] == [10.0] * 3


def test_difference_recovers_the_call_time_that_replay_reads_high_by_the_launch_overhead() -> None:
    gpu = FakeGpu(call_us=12.0, flush_us=30.0, overhead_us=5.0, jitter_us=1.0)
    k = num_calls_for(gpu.call_us + gpu.flush_us)
    difference = difference_sampler(gpu.call, gpu.flush, num_calls=k, timer=gpu.timer, capture=gpu.capture)
    replay = replay_sampler(gpu.call, gpu.flush, timer=gpu.timer, capture=gpu.capture)
    new, old = measure(difference, SETTINGS), measure(replay, SETTINGS)
    assert k == 11  # 500 µs of (flush, call) pairs of 42 µs
    assert new.median_us == pytest.approx(12.0, abs=0.1)
    assert old.median_us == pytest.approx(12.0 + 5.0, abs=0.5)
    # The overhead's jitter is paid once per launch of k calls: the difference is far quieter per call.
    assert new.p80_us - new.p20_us < (old.p80_us - old.p20_us) / 4


def test_the_two_launches_alternate_so_an_order_effect_cancels() -> None:
    gpu = FakeGpu(call_us=10.0, flush_us=20.0, overhead_us=4.0)
    order: list[str] = []

    def timer(launch: Callable[[], Any]) -> float:
        before = gpu.now_us
        gpu.timer(launch)
        order.append("calls" if gpu.now_us - before > 4.0 + 3 * 20.0 else "flushes")  # B: K + 1 flushes
        return gpu.now_us - before

    sample = difference_sampler(gpu.call, gpu.flush, num_calls=2, timer=timer, capture=gpu.capture)
    values = [sample() for _ in range(4)]
    assert order == ["calls", "flushes", "flushes", "calls", "calls", "flushes", "flushes", "calls"]
    assert values == [10.0] * 4


class WriteBackGpu(FakeGpu):
    """A call leaves ``dirty_us`` of dirty lines in L2; the next flush pays to write them back."""

    def __init__(self, *, dirty_us: float, **kwargs: float) -> None:
        super().__init__(**kwargs)
        self.dirty_us, self.dirty = dirty_us, False

    def call(self) -> None:
        super().call()
        self.dirty = True

    def flush(self) -> None:
        super().flush()
        self.now_us += self.dirty_us if self.dirty else 0.0
        self.dirty = False


@pytest.mark.parametrize("k", [1, 3, 11])
def test_each_call_pays_its_own_write_back_inside_its_launch_whatever_k(k: int) -> None:
    # Serving pays a call's write-back when the next kernel evicts its lines: 12 + 4 µs a call. With
    # no flush closing launch A, its last call's write-back fell to the next launch, A or B alike, and
    # the difference read 12 + 4 x (K - 1) / K.
    gpu = WriteBackGpu(call_us=12.0, flush_us=30.0, overhead_us=5.0, dirty_us=4.0)
    sample = difference_sampler(gpu.call, gpu.flush, num_calls=k, timer=gpu.timer, capture=gpu.capture)
    assert [sample() for _ in range(6)] == pytest.approx([16.0] * 6)


def test_a_call_lost_in_the_flush_jitter_gives_raw_differences_around_zero() -> None:
    gpu = FakeGpu(call_us=0.0, flush_us=30.0, overhead_us=5.0, jitter_us=2.0)
    sample = difference_sampler(gpu.call, gpu.flush, num_calls=1, timer=gpu.timer, capture=gpu.capture)
    values = [sample() for _ in range(200)]
    assert min(values) < 0 < max(values)  # never clamped: the band stays the differences' own
    stats = measure(sample, MeasureSpec(min_samples=10, max_samples=50, noise_target=0.01))
    assert stats.num_samples == 50  # a median near zero has no relative noise to stop on


def test_k_fills_the_target_launch_time_within_its_bounds() -> None:
    assert num_calls_for(5.0) == MAX_CALLS  # 100 would fit; K stops at 64
    assert num_calls_for(10.0) == 50
    assert num_calls_for(100.0) == 5
    assert num_calls_for(2000.0) == 1
    assert num_calls_for(0.0) == MAX_CALLS


def test_the_difference_method_applies_to_a_cold_l2_on_a_gpu_only() -> None:
    assert timing_of("cuda:0", "cold", "difference") is Timing.DIFFERENCE
    assert timing_of("cuda:0", "cold", "replay") is Timing.REPLAY
    assert timing_of("cuda:0", "warm", "difference") is Timing.REPLAY  # no flush to take out
    assert timing_of("cpu", "cold", "difference") is Timing.REPLAY  # the clock has no launch cost


def test_a_cpu_sampler_with_a_cold_cache_times_the_call_alone() -> None:
    calls: list[int] = []
    sample = make_sampler(lambda: calls.append(1), "cpu", "eager", "cold", "difference")
    assert sample() >= 0 and calls == [1]


def test_finals_whose_difference_median_is_not_above_zero_are_not_measurable() -> None:
    from tunectl.measure.rounds import NotMeasurable, round_times

    assert round_times([[[10.0, 11.0]], [[9.0]]], 0) == [[10.5], [9.0]]
    with pytest.raises(NotMeasurable, match="timing = 'replay'"):
        round_times([[[10.0]], [[-0.2, 0.1, -0.1]]], 0)


class QueueingGpu(FakeGpu):
    """A device whose timer queues several launches and waits for them once (``EventTimer.many``);
    ``waits`` counts the waits."""

    def __init__(self, **costs: float) -> None:
        super().__init__(**costs)
        self.waits = 0

    def many(self, launches: list[Callable[[], Any]], before: Callable[[], Any] | None = None) -> list[float]:
        self.waits += 1
        out = []
        for launch in launches:
            if before is not None:
                before()
            out.append(self.timer(launch))
        return out


def test_a_chunk_of_samples_is_queued_at_once_and_waits_for_the_device_once() -> None:
    costs = {"call_us": 12.0, "flush_us": 30.0, "overhead_us": 5.0, "jitter_us": 1.0}
    one_by_one, queued = FakeGpu(**costs), QueueingGpu(**costs)
    samplers = [
        difference_sampler(gpu.call, gpu.flush, num_calls=4, timer=timer, capture=gpu.capture)
        for gpu, timer in ((one_by_one, one_by_one.timer), (queued, queued))
    ]
    settings = MeasureSpec(warmup=0, min_samples=16, max_samples=16, noise_target=0.0, max_seconds=10.0)
    plain, chunked = (measure(s, settings) for s in samplers)
    assert chunked.num_samples == plain.num_samples == 16
    assert chunked.median_us == pytest.approx(plain.median_us) == pytest.approx(12.0, abs=0.2)
    assert queued.waits == 2, "a first sample to learn the pace, then the other 15 in one chunk"


def test_a_chunk_never_outlasts_the_time_left_at_the_pace_seen() -> None:
    from tunectl.measure.harness import MAX_CHUNK, next_chunk

    settings = MeasureSpec(min_samples=10, max_samples=500, max_seconds=1.0)
    assert next_chunk(0, settings, 1.0, None) == 1, "no pace yet: one sample"
    assert next_chunk(1, settings, 1.0, 0.001) == 9, "then up to the minimum"
    assert next_chunk(10, settings, 1.0, 0.001) == 10, "then as many again"
    assert next_chunk(200, settings, 1.0, 0.001) == MAX_CHUNK
    assert next_chunk(10, settings, 0.0035, 0.001) == 4, "what the time left allows"
    assert next_chunk(490, settings, 1.0, 0.001) == 10, "never past the cap on samples"


class FakeAllocator:
    """``torch.cuda``'s memory counters: ``reserved`` bytes held by the cache, ``allocated`` of them in
    tensors, ``free`` on the device; ``empty_cache`` gives the unallocated part back to the device."""

    def __init__(self, *, reserved: int, allocated: int, free: int) -> None:
        self.reserved, self.allocated, self.free = reserved, allocated, free

    def memory_reserved(self) -> int:
        return self.reserved

    def memory_allocated(self) -> int:
        return self.allocated

    def mem_get_info(self) -> tuple[int, int]:
        return self.free, 141 << 30

    def empty_cache(self) -> None:
        self.free += self.reserved - self.allocated
        self.reserved = self.allocated


@pytest.mark.parametrize(
    ("reserved_gib", "allocated_gib", "free_gib", "emptied"),
    [
        (136, 36, 1, True),  # the H200 case: 100 GiB cached, 1 GiB free; the capture needed 16
        (40, 1, 30, True),  # under a quarter of the device free: the cache gives back what it holds
        (1.5, 1, 0.25, True),  # little cached, little free
        (40, 1, 100, False),  # much cached, but plenty free: a capture does not pay for it
        (1, 1, 100, False),  # nothing cached
    ],
)
def test_a_capture_empties_the_cache_only_where_the_device_is_short_of_free_memory(
    reserved_gib: float, allocated_gib: float, free_gib: float, emptied: bool
) -> None:
    from tunectl.measure.graphs import make_room_for_capture

    gib = 1 << 30
    cuda = FakeAllocator(
        reserved=int(reserved_gib * gib), allocated=int(allocated_gib * gib), free=int(free_gib * gib)
    )
    assert make_room_for_capture(cuda) is emptied
    assert (cuda.reserved == cuda.allocated) is (emptied or reserved_gib == allocated_gib)
