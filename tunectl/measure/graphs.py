"""CUDA graphs for measuring: a call captured once and replayed, and the memory a capture needs.

A graph replays the addresses its kernels were captured with and owns none of the memory behind them,
so ``graph_of``'s replay keeps alive the callable it captured, with every tensor it holds. A capture
runs on a side stream after the device is synchronized, as ``torch.cuda.graph`` does it, but empties
the allocator's cache only where the device is short of free memory (``make_room_for_capture``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

#: eager calls on a side stream before a capture, where nothing warmed the call already
WARMUP_CALLS = 3
#: before a capture the allocator's cache is emptied where the device has less than this share free
CAPTURE_FREE_MIN_SHARE = 0.25


def graph_of(fn: Callable[[], Any], device: str, *, warmup_calls: int = WARMUP_CALLS) -> Callable[[], Any]:
    """``fn`` captured into a CUDA graph (after ``warmup_calls`` calls on a side stream, as capture
    requires, where nothing warmed it already): the graph's replay. The graph, and ``fn`` with every
    tensor it holds (the memory the graph's kernels use: module doc), live as long as the returned
    callable."""
    import torch

    with torch.cuda.device(device):
        if warmup_calls:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # lazy workspaces and handles get made here, not in the graph
                for _ in range(warmup_calls):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
        graph = _captured(fn)

    def replay() -> None:
        graph.replay()

    replay.captured = fn  # type: ignore[attr-defined]
    return replay


def make_room_for_capture(cuda: Any) -> bool:
    """Empty the allocator's cache (``cuda``: ``torch.cuda``) where the device has less than
    ``CAPTURE_FREE_MIN_SHARE`` of its memory free; whether it did. What a capture allocates comes from
    the graph's own pool, never from the cache's unallocated blocks, and the cache cannot give them back
    while the capture runs, so a call that needs more than the device has free fails there with an
    out-of-memory error that an eager call would not meet: on an H200, cuDNN SDPA's 16 GiB at 64 x
    32768 met 1 GiB free beside 100 GiB cached, unallocated. ``torch.cuda.graph`` empties the cache
    before every capture, which costs a capture ~1.4 ms of the host where there is something to give
    back, and the next tensors their fresh allocations; even reading how much the cache holds (the
    allocator's statistics) took ~0.5 ms a read in a profiled H200 run. Only the device's free memory
    is read here (one driver call): where a quarter of it is free, there is nothing to win."""
    free, total = cuda.mem_get_info()
    if free >= CAPTURE_FREE_MIN_SHARE * total:
        return False
    cuda.empty_cache()
    return True


def _captured(fn: Callable[[], Any]) -> Any:
    """``fn`` captured into a CUDA graph on a side stream of the current device, as ``torch.cuda.graph``
    captures it (the device synchronized first), but emptying the allocator's cache only where it holds
    much (``make_room_for_capture``). A call that fails while captured raises its own error, not the
    capture's."""
    import torch

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()  # nothing in flight when the capture begins
    make_room_for_capture(torch.cuda)
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="global")
        try:
            fn()
        except BaseException:
            with contextlib.suppress(Exception):  # the capture is invalid; the call's error says why
                graph.capture_end()
            raise
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    return graph
