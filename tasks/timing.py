"""Samplers: how one call of a kernel is timed on each kind of device.

CPU: the monotonic clock around a synchronous call. CUDA: events around the call on the current
stream. ``l2="cold"`` evicts the cache before every sample (outside the timed region) by writing a
buffer twice the size of the last-level cache.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tasks.harness import Sampler, cpu_sampler

_DEFAULT_LLC_BYTES = 64 << 20


def make_sampler(fn: Callable[[], Any], device: str, mode: str, l2: str) -> Sampler:
    """A sampler for ``fn`` on ``device``; ``mode`` is eager or graph (graph needs CUDA)."""
    if device.startswith("cuda"):
        return _cuda_sampler(fn, device, l2)
    if mode == "graph":
        raise ValueError("CUDA-graph replay needs a CUDA device")
    if l2 == "cold":
        return _with_flush(cpu_sampler(fn), _cpu_flush())
    return cpu_sampler(fn)


def _with_flush(sample: Sampler, flush: Callable[[], None]) -> Sampler:
    def flushed() -> float:
        flush()
        return sample()

    return flushed


def _cpu_flush() -> Callable[[], None]:
    import torch

    buf = torch.empty(2 * _llc_bytes() // 4, dtype=torch.float32)
    return lambda: buf.fill_(1.0) and None


def _llc_bytes() -> int:
    try:
        return int(os.sysconf("SC_LEVEL3_CACHE_SIZE")) or _DEFAULT_LLC_BYTES
    except (ValueError, OSError):
        return _DEFAULT_LLC_BYTES


def _cuda_sampler(fn: Callable[[], Any], device: str, l2: str) -> Sampler:
    import torch

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    flush = None
    if l2 == "cold":
        l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
        flush = torch.empty(2 * l2_bytes, dtype=torch.int8, device=device)

    def sample() -> float:
        if flush is not None:
            flush.zero_()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) * 1e3

    return sample
