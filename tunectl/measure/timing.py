"""Samplers: how one call of a kernel is timed on each kind of device, and by which method.

- CPU: the monotonic clock around a synchronous call (``replay``: one call per sample; with a cold
  cache a flush of twice the last-level cache runs first, outside the clock). Nothing fixed per
  sample worth taking out: the clock costs well under a microsecond.
- CUDA, cold L2, ``timing = "difference"`` (the default): ``tunectl.measure.difference``. A sample is
  a launch of K x (flush, call) and a closing flush minus a launch of K + 1 flushes, over K: one CUDA
  graph each in ``graph`` mode, eager launches in ``eager`` mode. No fixed cost per sample; the module
  docstring defines the estimator and its noise.
- CUDA, cold L2, ``timing = "replay"``: the earlier method, kept for comparison. The L2 is written
  over (``zero_``) outside the timed region and a sample times one launch of one call (a graph
  replay, or an eager call) between events. Each sample carries the launch's fixed cost: on an
  H200, 2-4 µs above the difference method for 10-40 µs kernels (benchmarks/results/timing.md).
- CUDA, warm L2 (either ``timing``): ``replay`` of ``reps`` calls per launch (enough for
  ~``_GRAPH_TARGET_US`` in graph mode; one call eager), a sample the launch's time over ``reps``.
  The fixed cost is paid once per launch and shared by its calls: a few µs over ~200 µs, about 1 %
  at most, alike for every config; nothing to take out, and no flush to take out either.

In every mode a spin kernel queued ahead of the start event keeps the host's launch latency out.
``timing_of`` says which method a measurement used; the runner records it in every row.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from tunectl.core.record import Timing
from tunectl.measure.difference import (
    cuda_difference_sampler,
    cuda_flush,
    cuda_parts,
    gpu_time_us,
    replay_sampler,
)
from tunectl.measure.harness import Sampler, cpu_sampler

_DEFAULT_LLC_BYTES = 64 << 20
# A host's whole last-level cache (hundreds of MB on a server) is shared by every core: between two
# layers on a few cores a model evicts what those cores' share holds, not all of it.
_CPU_STACK_THRASH_BYTES = 32 << 20
_GRAPH_TARGET_US = 200.0  # a warm-L2 replay this long keeps launch and event overhead under ~1 %
_GRAPH_MAX_REPS = 64


def timing_of(device: str, l2: str, timing: str) -> Timing:
    """The method a measurement on ``device`` uses: ``difference`` only for a cold L2 on a GPU."""
    if device.startswith("cuda") and l2 == "cold" and timing == Timing.DIFFERENCE:
        return Timing.DIFFERENCE
    return Timing.REPLAY


def make_sampler(
    fn: Callable[[], Any], device: str, mode: str, l2: str, timing: str = Timing.REPLAY
) -> Sampler:
    """A sampler for ``fn`` on ``device``; ``mode`` is eager or graph (graph needs CUDA); ``timing``
    as the spec's ``measure.timing`` (``timing_of`` says where it applies)."""
    if mode not in ("eager", "graph"):
        raise ValueError(f"unknown measure mode {mode!r}; expected eager or graph")
    if device.startswith("cuda"):
        return _cuda_sampler(fn, device, mode, l2, timing_of(device, l2, timing))
    if mode == "graph":
        raise ValueError("CUDA-graph replay needs a CUDA device")
    if l2 == "cold":
        return _with_flush(cpu_sampler(fn), _cpu_flush())
    return cpu_sampler(fn)


def _cuda_sampler(fn: Callable[[], Any], device: str, mode: str, l2: str, timing: Timing) -> Sampler:
    if timing is Timing.DIFFERENCE:
        return cuda_difference_sampler(fn, device, mode)
    parts = cuda_parts(device, mode)
    flush = cuda_flush(device, "write") if l2 == "cold" else None  # the replay method's own flush
    reps = 1 if l2 == "cold" or mode == "eager" else _reps_for(gpu_time_us(fn))
    sample = replay_sampler(fn, flush, num_calls=reps, timer=parts.timer, capture=parts.capture)
    if mode == "eager":
        parts.timer.cover(sample.launches[0])  # type: ignore[attr-defined]
    return sample


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
    flush = cuda_flush(device, "write")

    def stack() -> None:
        for layer in layers:
            flush()
            layer()

    def thrash_only() -> None:
        for _ in layers:
            flush()

    # "cold": one stack per graph replay, and the cache evicted before each sample as well. The
    # runner takes the thrash-only stack's time out of each round: a difference already.
    return make_sampler(stack if with_calls else thrash_only, device, mode, "cold", Timing.REPLAY)


def _cpu_stack_sampler(layers: Sequence[Callable[[], Any]], flush: Callable[[], None]) -> Sampler:
    timers = [cpu_sampler(layer) for layer in layers]  # a simulated call reports its own cost

    def sample() -> float:
        total = 0.0
        for timer in timers:
            flush()
            total += timer()
        return total

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


def _reps_for(estimate_us: float) -> int:
    """Calls per warm-L2 replay: enough for ~_GRAPH_TARGET_US, at least 1, at most _GRAPH_MAX_REPS."""
    if estimate_us <= 0:
        return _GRAPH_MAX_REPS
    return max(1, min(_GRAPH_MAX_REPS, int(_GRAPH_TARGET_US // estimate_us) or 1))
