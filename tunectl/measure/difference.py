"""Timing a call with a cold L2 without a fixed cost per sample: the difference method.

A sample is one paired difference. Two launches are built once: A holds K x (flush, call), B holds
the K flushes alone. A sample times A and B back to back, in alternating order (A then B, then B
then A on the next sample), each between two events with a spin kernel ahead so the host's launch
latency stays out, and is

    d = (t(A) - t(B)) / K

What a launch costs once (events, a graph's launch, the spin's tail: a fixed o) is in both t(A) and
t(B) and cancels; so does a slow drift of the GPU, which moves two launches a millisecond apart
alike. What remains is the call's time after a flush, as a serving step pays it between other
kernels. K is chosen once so that A lasts about ``TARGET_LAUNCH_US`` (events then resolve it to a
small fraction), from 1 to ``MAX_CALLS``.

The harness (``tunectl.measure.harness``) takes the samples as they come: their median, p20-p80 band and
relative noise are those of the paired differences, and it samples until that noise reaches the
spec's target. The noise of one difference is that of two launches (about sqrt(2) x the jitter of
one launch of K flushes, over K), so it falls as 1/K: with K = 32 a call's sample carries about a
twentieth of the launch jitter a single-call replay's does. Samples are never clamped: clamping
would bias the band. For a call much shorter than the flush's jitter a difference can be negative;
a measurement whose median is not above zero cannot tell the call from the flush, and the runner
records it as an error that says so (never as a time that could win).

The flush is a module constant, ``FLUSH``, one line to flip; ``benchmarks/gpu/sampler_methods.py``
times both on a GPU, and ``read`` is the default for the reason below until a measurement says
otherwise:

- ``read``: a reduction over a buffer twice the L2 into a preallocated output. It leaves no dirty
  lines, so the call after it pays nothing for the flush, and the flush after a call pays to write
  back what the call wrote, which serving pays too. The default.
- ``write``: zeroing the buffer (what the replay method always did). Its dirty lines are written back
  while the next kernel runs: in A that is the call, in B the next flush, which do not pay alike.

This module knows only callables: a ``timer`` (how long the device took for a launch) and a
``capture`` (a callable made into one launch: a CUDA graph, or the callable itself when eager).
``cuda_parts`` gives the real ones; tests give fakes of the device and its clock.

A CUDA graph replays the addresses its kernels were captured with and owns none of the memory behind
them (a call's page-table copy, output, workspace; the flush's buffer): freed, that memory goes back
to the allocator and is handed to the next tensor made, which the replay then reads as page indices or
writes over. So what a launch runs must live as long as the launch: a sampler keeps the call and the
flush it times, and ``graph_of``'s replay keeps the callable it captured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Sampler = Callable[[], float]
Timer = Callable[[Callable[[], Any]], float]  # µs the device took for one launch
Capture = Callable[[Callable[[], Any]], Callable[[], Any]]  # a callable made into one launch
FlushKind = Literal["read", "write"]

FLUSH: FlushKind = "read"
TARGET_LAUNCH_US = 500.0  # A this long: the events' ~1 µs resolution is 0.2 % of it, and a sample ~1 ms
MAX_CALLS = 64
_SPIN_CYCLES = 200_000  # ~0.1 ms at H200 clocks: several graph launches' host latency (eager: ``cover``)
_WARMUP_CALLS = 3


def num_calls_for(pair_us: float, *, target_us: float = TARGET_LAUNCH_US, max_calls: int = MAX_CALLS) -> int:
    """K: how many (flush, call) pairs of ``pair_us`` fill ``target_us``, from 1 to ``max_calls``."""
    if pair_us <= 0:
        return max_calls
    return max(1, min(max_calls, int(target_us // pair_us)))


def repeated(fn: Callable[[], Any], flush: Callable[[], Any] | None, times: int) -> Callable[[], None]:
    """A callable running ``times`` x (``flush``, ``fn``), or ``times`` x ``fn`` without a flush."""

    def run() -> None:
        for _ in range(times):
            if flush is not None:
                flush()
            fn()

    return run


def difference_sampler(
    fn: Callable[[], Any], flush: Callable[[], Any], *, num_calls: int, timer: Timer, capture: Capture
) -> Sampler:
    """Samples of (t(K x (flush, fn)) - t(K x flush)) / K, the two launches in alternating order."""
    calls = capture(repeated(fn, flush, num_calls))
    flushes = capture(repeated(flush, None, num_calls))
    taken = 0

    def sample() -> float:
        nonlocal taken
        taken += 1
        if taken % 2:  # the order alternates, so a launch that runs first for being first cancels too
            t_calls = timer(calls)
            t_flushes = timer(flushes)
        else:
            t_flushes = timer(flushes)
            t_calls = timer(calls)
        return (t_calls - t_flushes) / num_calls

    sample.num_calls = num_calls  # type: ignore[attr-defined]
    sample.launches = (calls, flushes)  # type: ignore[attr-defined]  # a graph lives as long as its sampler
    sample.runs = (fn, flush)  # type: ignore[attr-defined]  # and so does what the graphs read and write
    return sample


def replay_sampler(
    fn: Callable[[], Any],
    flush: Callable[[], Any] | None,
    *,
    num_calls: int = 1,
    timer: Timer,
    capture: Capture,
) -> Sampler:
    """Samples of t(one launch of ``num_calls`` calls) / ``num_calls``, ``flush`` run before each launch
    outside the timed region: the replay method (a sample carries the launch's fixed cost / num_calls)."""
    launch = capture(repeated(fn, None, num_calls))

    def sample() -> float:
        if flush is not None:
            flush()
        return timer(launch) / num_calls

    sample.num_calls = num_calls  # type: ignore[attr-defined]
    sample.launches = (launch,)  # type: ignore[attr-defined]
    sample.runs = (fn, flush)  # type: ignore[attr-defined]  # what the launch reads and writes (module doc)
    return sample


def cuda_difference_sampler(
    fn: Callable[[], Any], device: str, mode: str, *, flush_kind: FlushKind = FLUSH
) -> Sampler:
    """The difference method for ``fn`` on a CUDA device: graphs (``graph``) or eager launches
    (``eager``), K chosen from a first eager estimate of one (flush, call) pair."""
    parts = cuda_parts(device, mode)
    flush = cuda_flush(device, flush_kind)
    k = num_calls_for(gpu_time_us(repeated(fn, flush, 1)))
    sample = difference_sampler(fn, flush, num_calls=k, timer=parts.timer, capture=parts.capture)
    if mode == "eager":
        parts.timer.cover(sample.launches[0])  # type: ignore[attr-defined]
    return sample


@dataclass
class CudaParts:
    """The real timer and capture on one CUDA device (``cuda_parts``)."""

    timer: EventTimer
    capture: Capture


def cuda_parts(device: str, mode: str) -> CudaParts:
    """An event timer, and a capture that makes a CUDA graph (``graph``) or runs the callable (``eager``)."""
    timer = EventTimer()
    if mode == "graph":
        return CudaParts(timer, lambda fn: graph_of(fn, device))
    return CudaParts(timer, lambda fn: fn)


class EventTimer:
    """Times one launch with CUDA events on the current stream, a spin kernel queued first so the GPU is
    still busy while the host launches (the sample is the GPU's time, not the host's latency)."""

    def __init__(self) -> None:
        import torch

        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.spin_cycles = _SPIN_CYCLES

    def __call__(self, launch: Callable[[], Any]) -> float:
        import torch

        torch.cuda._sleep(self.spin_cycles)
        self.start.record()
        launch()
        self.end.record()
        self.end.synchronize()
        return float(self.start.elapsed_time(self.end)) * 1e3

    def cover(self, launch: Callable[[], Any]) -> None:
        """Lengthen the spin to outlast the host's time to launch ``launch`` (eager launches of K calls
        take the host longer than one graph replay), so the GPU never waits for the host."""
        import torch

        launch()  # warm: a first launch pays one-time costs (library handles, lazy loads) serving does not
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        launch()
        host_us = (time.perf_counter() - t0) * 1e6
        self.start.record()
        torch.cuda._sleep(_SPIN_CYCLES)
        self.end.record()
        self.end.synchronize()
        cycles_per_us = _SPIN_CYCLES / max(float(self.start.elapsed_time(self.end)) * 1e3, 1.0)
        self.spin_cycles = max(_SPIN_CYCLES, int(1.5 * host_us * cycles_per_us))


def graph_of(fn: Callable[[], Any], device: str) -> Callable[[], Any]:
    """``fn`` captured into a CUDA graph (after a warm-up on a side stream, as capture requires):
    the graph's replay. The graph, and ``fn`` with every tensor it holds (the memory the graph's
    kernels use: module doc), live as long as the returned callable."""
    import torch

    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # lazy workspaces and handles get made here, not in the graph
            for _ in range(_WARMUP_CALLS):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()

    def replay() -> None:
        graph.replay()

    replay.captured = fn  # type: ignore[attr-defined]
    return replay


def cuda_flush(device: str, kind: FlushKind = FLUSH) -> Callable[[], None]:
    """A kernel that evicts the L2: a read (a sum into a preallocated output) or a write (zeroing) of a
    buffer twice the L2's size. Capturable in a CUDA graph: it allocates nothing per call."""
    import torch

    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    if kind == "write":
        buf = torch.empty(2 * l2_bytes, dtype=torch.int8, device=device)

        def write() -> None:
            buf.zero_()

        return write
    data = torch.ones(2 * l2_bytes // 4, dtype=torch.float32, device=device)
    out = torch.empty((), dtype=torch.float32, device=device)

    def read() -> None:
        torch.sum(data, dim=0, out=out)

    return read


def gpu_time_us(fn: Callable[[], Any], calls: int = 3) -> float:
    """The GPU's average time for ``fn`` over ``calls`` eager calls: a first estimate, for choosing K."""
    timer = EventTimer()
    return timer(repeated(fn, None, calls)) / calls
