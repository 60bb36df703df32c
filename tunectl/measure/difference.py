"""Timing a call with a cold L2 without a fixed cost per sample: the difference method.

A sample is one paired difference. Two launches are built once: A holds K x (flush, call) and a
closing flush, B the K + 1 flushes alone. A sample times A and B back to back, in alternating order
(A then B, then B then A on the next sample), each between two events with a spin kernel ahead so
the host's launch latency stays out, and is

    d = (t(A) - t(B)) / K

Both launches end on a flush, so each of A's K calls has a flush after it inside A, which pays to
write back what the call left dirty in L2, as serving pays it; and neither launch leaves a call's
dirty lines to whichever launch comes next. Without the closing flush the last call's write-back
fell to the next launch, an A or a B alike, and left the difference: a call that writes much (an
elementwise kernel over 256 MiB: ~4 µs of ~130) read low by that write-back over K.

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
flush it times, and ``graph_of``'s replay keeps the callable it captured (``tunectl.measure.graphs``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tunectl.measure.graphs import WARMUP_CALLS, graph_of
from tunectl.measure.harness import Sampler, chunked

Timer = Callable[[Callable[[], Any]], float]  # µs the device took for one launch
Capture = Callable[[Callable[[], Any]], Callable[[], Any]]  # a callable made into one launch
FlushKind = Literal["read", "write"]

FLUSH: FlushKind = "read"
#: the flush's buffer, in L2 sizes (``cuda_flush``); ``benchmarks/gpu/sampler_methods.py`` reads the
#: same kernels with smaller flushes, to see how small one may be and still leave the L2 cold
FLUSH_L2S = 2.0
TARGET_LAUNCH_US = 500.0  # A this long: the events' ~1 µs resolution is 0.2 % of it, and a sample ~1 ms
MAX_CALLS = 64
_SPIN_CYCLES = 200_000  # ~0.1 ms at H200 clocks: several graph launches' host latency (eager: ``cover``)


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


def closed(fn: Callable[[], Any], flush: Callable[[], Any], times: int) -> Callable[[], None]:
    """A callable running ``times`` x (``flush``, ``fn``), then ``flush``: launch A of the module doc."""
    calls = repeated(fn, flush, times)

    def run() -> None:
        calls()
        flush()

    return run


def flushes_alone(flush: Callable[[], Any], times: int) -> Callable[[], None]:
    """``times`` + 1 flushes: launch B of the module doc, for ``times`` calls."""
    return repeated(flush, None, times + 1)


def difference_sampler(
    fn: Callable[[], Any],
    flush: Callable[[], Any],
    *,
    num_calls: int,
    timer: Timer,
    capture: Capture,
    flushes: Callable[[], Any] | None = None,
) -> Sampler:
    """Samples of (t(K x (flush, fn), flush) - t((K + 1) x flush)) / K, the two launches in
    alternating order. ``flushes``: launch B where one is kept for every sampler with this K (it reads
    and writes nothing of ``fn``'s), else captured here. The sampler's ``many(n)`` queues n samples'
    launches at once (``timed_launches``)."""
    calls = capture(closed(fn, flush, num_calls))
    flushes = flushes if flushes is not None else capture(flushes_alone(flush, num_calls))
    taken = 0

    def many(n: int) -> list[float]:
        nonlocal taken
        firsts = [(taken + j + 1) % 2 == 1 for j in range(n)]  # odd samples launch the calls first
        taken += n
        order = [launch for first in firsts for launch in ((calls, flushes) if first else (flushes, calls))]
        times = timed_launches(timer, order)
        out = []
        for j, first in enumerate(firsts):
            t_a, t_b = times[2 * j], times[2 * j + 1]
            t_calls, t_flushes = (t_a, t_b) if first else (t_b, t_a)
            out.append((t_calls - t_flushes) / num_calls)
        return out

    # a graph lives as long as its sampler (``launches``), and so does what the graphs read and write
    return chunked(many, num_calls=num_calls, launches=(calls, flushes), runs=(fn, flush))


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

    def many(n: int) -> list[float]:
        return [t / num_calls for t in timed_launches(timer, [launch] * n, before=flush)]

    # the launch, and what it reads and writes, live as long as the sampler (module doc)
    return chunked(many, num_calls=num_calls, launches=(launch,), runs=(fn, flush))


def timed_launches(
    timer: Timer, launches: Sequence[Callable[[], Any]], before: Callable[[], Any] | None = None
) -> list[float]:
    """Each launch's time: all queued at once where the timer can (``EventTimer.many``), else one by
    one. ``before`` runs ahead of each launch, outside its timed region."""
    many = getattr(timer, "many", None)
    if many is not None:
        return list(many(launches, before=before))
    out = []
    for launch in launches:
        if before is not None:
            before()
        out.append(timer(launch))
    return out


def cuda_difference_sampler(
    fn: Callable[[], Any],
    device: str,
    mode: str,
    *,
    flush_kind: FlushKind = FLUSH,
    flush_l2s: float = FLUSH_L2S,
) -> Sampler:
    """The difference method for ``fn`` on a CUDA device: graphs (``graph``) or eager launches
    (``eager``), K chosen from a first estimate of one (flush, call) pair, which also warms ``fn`` for
    its capture. Launch B (K + 1 flushes) is kept per device and K, for every sampler that needs it."""
    parts = cuda_parts(device, mode, warmup_calls=0)  # ``warm_pair_us`` warms what is captured
    flush = cuda_flush(device, flush_kind, flush_l2s)
    pair_us = warm_pair_us(fn, flush, device)
    k = num_calls_for(pair_us)
    key = (device, mode, flush_kind, flush_l2s, k)
    if key not in _FLUSHES:
        _FLUSHES[key] = parts.capture(flushes_alone(flush, k))
    sample = difference_sampler(
        fn, flush, num_calls=k, timer=parts.timer, capture=parts.capture, flushes=_FLUSHES[key]
    )
    sample.expected_us = 2 * k * pair_us  # type: ignore[attr-defined]  # sizes the harness's first chunk
    if mode == "eager":
        parts.timer.cover(sample.launches[0])  # type: ignore[attr-defined]
    return sample


#: per (device, mode, flush kind and size, K): launch B (K + 1 flushes) every difference sampler with
#: that K times
_FLUSHES: dict[tuple[str, str, str, float, int], Callable[[], Any]] = {}
#: per (device, kind, size): the flush; its buffer lives for the process (the graphs above read it)
_FLUSH_KERNELS: dict[tuple[str, str, float], Callable[[], None]] = {}


@dataclass
class CudaParts:
    """The real timer and capture on one CUDA device (``cuda_parts``)."""

    timer: EventTimer
    capture: Capture


def cuda_parts(device: str, mode: str, *, warmup_calls: int = WARMUP_CALLS) -> CudaParts:
    """An event timer, and a capture that makes a CUDA graph (``graph``, after ``warmup_calls`` calls)
    or runs the callable (``eager``)."""
    timer = EventTimer()
    if mode == "graph":
        return CudaParts(timer, lambda fn: graph_of(fn, device, warmup_calls=warmup_calls))
    return CudaParts(timer, lambda fn: fn)


class EventTimer:
    """Times launches with CUDA events on the current stream, a spin kernel queued first so the GPU is
    still busy while the host launches (a sample is the GPU's time, not the host's latency).

    ``many`` queues several launches, each between its own two events, behind one spin, and waits for
    the device once: the host stays ahead of the GPU after the first launch (a graph's launch costs the
    host microseconds, its replay the GPU hundreds), so the spin and the wait are paid per chunk."""

    def __init__(self) -> None:
        self.spin_cycles = _SPIN_CYCLES
        self.covering = False  # eager launches: the spin must outlast the host's launching (``cover``)
        self._events: list[Any] = []

    def __call__(self, launch: Callable[[], Any]) -> float:
        return self.many([launch])[0]

    def many(
        self, launches: Sequence[Callable[[], Any]], before: Callable[[], Any] | None = None
    ) -> list[float]:
        """Each launch's device time in µs, all queued behind one spin and read after one wait;
        ``before`` runs ahead of each launch, outside its events."""
        import torch

        events = self._pairs(len(launches))
        stream = torch.cuda.current_stream()  # read once: each read costs the host ~30 µs
        torch.cuda._sleep(self.spin_cycles * (len(launches) if self.covering else 1))
        for launch, (start, end) in zip(launches, events, strict=False):
            if before is not None:
                before()
            start.record(stream)
            launch()
            end.record(stream)
        events[len(launches) - 1][1].synchronize()
        return [float(start.elapsed_time(end)) * 1e3 for start, end in events[: len(launches)]]

    def _pairs(self, n: int) -> list[Any]:
        import torch

        while len(self._events) < n:
            self._events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
        return self._events

    def cover(self, launch: Callable[[], Any]) -> None:
        """Lengthen the spin to outlast the host's time to launch ``launch`` (eager launches of K calls
        take the host longer than one graph replay), so the GPU never waits for the host."""
        import torch

        launch()  # warm: a first launch pays one-time costs (library handles, lazy loads) serving does not
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        launch()
        host_us = (time.perf_counter() - t0) * 1e6
        start, end = self._pairs(1)[0]
        start.record()
        torch.cuda._sleep(_SPIN_CYCLES)
        end.record()
        end.synchronize()
        cycles_per_us = _SPIN_CYCLES / max(float(start.elapsed_time(end)) * 1e3, 1.0)
        self.spin_cycles = max(_SPIN_CYCLES, int(1.5 * host_us * cycles_per_us))
        self.covering = True


def cuda_flush(device: str, kind: FlushKind = FLUSH, l2s: float = FLUSH_L2S) -> Callable[[], None]:
    """A kernel that evicts the L2: a read (a sum into a preallocated output) or a write (zeroing) of a
    buffer ``l2s`` times the L2's size (twice). Capturable in a CUDA graph: it allocates nothing per
    call. One per device, kind and size for the process (its buffer is read by the graphs that capture
    it)."""
    import torch

    key = (device, kind, l2s)
    if key in _FLUSH_KERNELS:
        return _FLUSH_KERNELS[key]
    num_bytes = int(l2s * torch.cuda.get_device_properties(device).L2_cache_size) // 4 * 4
    if kind == "write":
        buf = torch.empty(num_bytes, dtype=torch.int8, device=device)

        def write() -> None:
            buf.zero_()

        _FLUSH_KERNELS[key] = write
        return write
    data = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    out = torch.empty((), dtype=torch.float32, device=device)

    def read() -> None:
        torch.sum(data, dim=0, out=out)

    _FLUSH_KERNELS[key] = read
    return read


def warm_pair_us(fn: Callable[[], Any], flush: Callable[[], Any], device: str, pairs: int = 1) -> float:
    """The GPU's time for one (flush, ``fn``) pair: a first estimate, for choosing K. Run on a side
    stream after one untimed pair, so it is also the warm-up a graph capture of ``fn`` needs (lazy
    workspaces and handles made outside the graph), and behind a spin, so the host's launching of
    the timed pairs stays out of it. One timed pair is enough for K (an integer of ~500 µs over the
    pair): a config's first look pays for each pair, a 2 ms call 2 ms."""
    import torch

    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            flush()
            fn()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(_SPIN_CYCLES)
            start.record()
            repeated(fn, flush, pairs)()
            end.record()
        torch.cuda.current_stream().wait_stream(side)
        end.synchronize()
    return float(start.elapsed_time(end)) * 1e3 / pairs


def gpu_time_us(fn: Callable[[], Any], calls: int = 3) -> float:
    """The GPU's average time for ``fn`` over ``calls`` eager calls: a first estimate, for choosing K."""
    timer = EventTimer()
    return timer(repeated(fn, None, calls)) / calls
