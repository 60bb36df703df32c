"""Samplers: how one call of a kernel is timed on each kind of device.

- CPU: the monotonic clock around a synchronous call.
- CUDA, ``eager``: events around one call on the current stream, as a framework without graphs runs it.
  A short spin kernel is queued before the start event, so the GPU is still busy while the CPU
  launches the call: the sample is the GPU's time for the call, not the host's launch latency.
- CUDA, ``graph``: the call is captured into a CUDA graph after a warm-up and each sample times one
  replay with events, as a serving engine runs decode. With a warm L2 a replay holds ``reps`` copies
  of the call (enough for ~``_GRAPH_TARGET_US``) and a sample is the replay's time over ``reps``;
  with a cold L2 a replay holds one call. As in eager mode, a spin kernel ahead of the start event
  keeps the host's launch latency out of the sample.

``l2="cold"`` evicts the last-level cache before every sample, outside the timed region (and outside
any graph), by writing a buffer twice the size of the cache.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from tasks.harness import Sampler, cpu_sampler

_DEFAULT_LLC_BYTES = 64 << 20
# A host's whole last-level cache (hundreds of MB on a server) is shared by every core: between two
# layers on a few cores a model evicts what those cores' share holds, not all of it.
_CPU_STACK_THRASH_BYTES = 32 << 20
_GRAPH_TARGET_US = 200.0  # a warm-L2 replay this long keeps launch and event overhead under ~1 %
_GRAPH_MAX_REPS = 64
_GRAPH_WARMUP_CALLS = 3
_SPIN_CYCLES = 500_000  # ~0.25 ms at H200 clocks: longer than a compiled call's host overhead


def make_sampler(fn: Callable[[], Any], device: str, mode: str, l2: str) -> Sampler:
    """A sampler for ``fn`` on ``device``; ``mode`` is eager or graph (graph needs CUDA)."""
    if mode not in ("eager", "graph"):
        raise ValueError(f"unknown measure mode {mode!r}; expected eager or graph")
    if device.startswith("cuda"):
        if mode == "graph":
            return _graph_sampler(fn, device, l2)
        return _event_sampler(fn, device, l2)
    if mode == "graph":
        raise ValueError("CUDA-graph replay needs a CUDA device")
    if l2 == "cold":
        return _with_flush(cpu_sampler(fn), _cpu_flush())
    return cpu_sampler(fn)


def stack_sampler(
    layers: Sequence[Callable[[], Any]], device: str, mode: str, with_calls: bool = True
) -> Sampler:
    """Times a stack: each of ``layers`` called in turn, a cache-thrashing kernel before each (a write
    of twice the L2 on a GPU), as a model's other kernels evict the cache between its attention
    layers. On a GPU the stack is timed whole (one graph replay in graph mode); without the calls
    (``with_calls=False``) it times the thrash kernels alone, for the caller to take out. On a CPU
    each call is timed on its own, between thrashes, and a sample is the sum: nothing to take out."""
    if not device.startswith("cuda"):
        return _cpu_stack_sampler(layers if with_calls else [], _cpu_flush(_CPU_STACK_THRASH_BYTES))
    flush = _cuda_flush(device)

    def stack() -> None:
        for layer in layers:
            flush()
            layer()

    def thrash_only() -> None:
        for _ in layers:
            flush()

    # "cold": one stack per graph replay, and the cache evicted before each sample as well.
    return make_sampler(stack if with_calls else thrash_only, device, mode, "cold")


def _cpu_stack_sampler(layers: Sequence[Callable[[], Any]], flush: Callable[[], None]) -> Sampler:
    def sample() -> float:
        total = 0
        for layer in layers:
            flush()
            t0 = time.perf_counter_ns()
            layer()
            total += time.perf_counter_ns() - t0
        return total / 1e3

    return sample


def _with_flush(sample: Sampler, flush: Callable[[], None]) -> Sampler:
    def flushed() -> float:
        flush()
        return sample()

    return flushed


def _cpu_flush(num_bytes: int | None = None) -> Callable[[], None]:
    import torch

    buf = torch.empty((num_bytes or 2 * _llc_bytes()) // 4, dtype=torch.float32)

    def flush() -> None:
        buf.fill_(1.0)

    return flush


def _llc_bytes() -> int:
    try:
        return int(os.sysconf("SC_LEVEL3_CACHE_SIZE")) or _DEFAULT_LLC_BYTES
    except (ValueError, OSError):
        return _DEFAULT_LLC_BYTES


def _cuda_flush(device: str) -> Callable[[], None]:
    import torch

    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    buf = torch.empty(2 * l2_bytes, dtype=torch.int8, device=device)

    def flush() -> None:
        buf.zero_()

    return flush


def _event_sampler(launch: Callable[[], Any], device: str, l2: str, calls_per_launch: int = 1) -> Sampler:
    """Times one ``launch`` with CUDA events: cache flushed first (cold), a spin kernel queued ahead of
    the start event so the host's launch latency stays out; the time per call."""
    import torch

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    flush = _cuda_flush(device) if l2 == "cold" else None

    def sample() -> float:
        if flush is not None:
            flush()
        torch.cuda._sleep(_SPIN_CYCLES)  # keeps the GPU busy while the host launches
        start.record()
        launch()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) * 1e3 / calls_per_launch

    return sample


def _graph_sampler(fn: Callable[[], Any], device: str, l2: str) -> Sampler:
    """Capture ``fn`` into a CUDA graph and time replays (see module doc)."""
    import torch

    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        # Warm up on a side stream, as capture requires: lazy workspaces and handles get made here.
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(_GRAPH_WARMUP_CALLS):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        reps = 1 if l2 == "cold" else _reps_for(_eager_estimate_us(fn))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        torch.cuda.synchronize()
    sample = _event_sampler(graph.replay, device, l2, reps)
    sample.graph = graph  # type: ignore[attr-defined]  # the graph lives as long as its sampler
    sample.reps = reps  # type: ignore[attr-defined]
    return sample


def _eager_estimate_us(fn: Callable[[], Any]) -> float:
    import torch

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) * 1e3 / 3


def _reps_for(estimate_us: float) -> int:
    """Calls per warm-L2 replay: enough for ~_GRAPH_TARGET_US, at least 1, at most _GRAPH_MAX_REPS."""
    if estimate_us <= 0:
        return _GRAPH_MAX_REPS
    return max(1, min(_GRAPH_MAX_REPS, int(_GRAPH_TARGET_US // estimate_us) or 1))
