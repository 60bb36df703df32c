"""Building a point's inputs while other processes on the device hold memory for a while.

A wait for memory that other processes hold (compile processes keep a point's inputs while they build
its kernels, 8 GiB at batch 64 x 32768) reads the device's free memory every ``POLL_S`` and tries
again as soon as the failed request would fit, not at the end of its pause: on an H100 80GB, pauses of
0.25 to 4 s held a look 7.75 s for memory the compile processes gave back within them."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from tunectl.tasks.compile import out_of_memory, release

log = logging.getLogger("tunectl.worker")
T = TypeVar("T")

#: how long a point's set-up waits for device memory held by other processes before its items fail
MEMORY_WAIT_S = 60.0
#: how often a wait reads the device's free memory (one driver call, microseconds)
POLL_S = 0.05


def when_memory_frees(
    build: Callable[[], T], device: str, make_room: Callable[[], bool] = lambda: False
) -> T:
    """``build()``; while it runs out of device memory that other processes hold (compile processes
    building beside this worker give theirs back after each build), wait and try again, for up to
    ``MEMORY_WAIT_S``; past that, raise as it does. ``make_room`` lets go of what this process keeps
    and could do without (the points it keeps built), before each try; where it let something go, the
    next try comes at once. Where the failed request is more than the device had free and every other
    process holds together (``beyond_others``), no wait can make it fit: it raises at once."""
    waited, pause = 0.0, 0.25
    while True:
        try:
            return build()
        except Exception as exc:
            if not out_of_memory(exc) or waited >= MEMORY_WAIT_S:
                raise
            report = _report(str(exc))
            hopeless, freed = _beyond(report), make_room()
            if hopeless and not freed:
                log.warning("out of device memory on %s, not waiting: %s", device, hopeless)
                raise
            if not freed:
                log.warning(
                    "out of device memory on %s, waiting up to %.2f s: %s",
                    device,
                    pause,
                    (str(exc).splitlines() or [""])[0],
                )
        release(device)  # outside the handler: the failed attempt's tensors are gone by now
        if freed:
            continue
        until_free(device, report.asked if report else None, pause)
        waited, pause = waited + pause, min(2 * pause, 4.0)  # a try per pause at most, as many as before


def until_free(device: str, asked: float | None, pause: float) -> None:
    """Wait up to ``pause`` seconds, returning as soon as ``device`` has ``asked`` bytes free (read
    every ``POLL_S``); the whole pause where the size or the device's free memory cannot be read."""
    if asked is None or not device.startswith("cuda"):
        time.sleep(pause)
        return
    waited = 0.0
    while waited < pause and free_bytes(device) < asked:
        step = min(POLL_S, pause - waited)
        time.sleep(step)
        waited += step


def free_bytes(device: str) -> int:
    """The device's free memory, as its driver reports it."""
    import torch

    return int(torch.cuda.mem_get_info(device)[0])


def short_of_memory(device: str, share: float) -> bool:
    """Whether ``device`` has less than ``share`` of its memory free or cached unallocated (a CPU never
    is: what it keeps is bounded by count alone)."""
    if not device.startswith("cuda"):
        return False
    import torch

    free, total = torch.cuda.mem_get_info(device)
    idle = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return bool(free + idle < share * total)


_SIZE = r"([0-9.]+) (B|KiB|MiB|GiB|TiB)"
_UNITS = {"B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}
# torch's caching allocator says, of a failed request, its size, the device's capacity and free memory,
# and what this process holds ("Including non-PyTorch memory, this process has ... in use").
_REPORT = re.compile(
    rf"Tried to allocate {_SIZE}\..*?total capacity of {_SIZE} of which {_SIZE} is free\."
    rf".*?this process has {_SIZE} memory in use",
    re.DOTALL,
)


def beyond_others(message: str) -> str:
    """Why waiting for other processes cannot satisfy the failed request ``message`` reports: it asks
    more than was free plus everything the other processes on the device hold (even were they all to
    let go, it would not fit); empty where it could, or where the message does not say (another
    allocator or version: then waiting is tried as before)."""
    return _beyond(_report(message))


class _Report(NamedTuple):
    """torch's report of a failed request, in bytes: the size asked, the device's capacity, its free
    memory, and what this process holds."""

    asked: float
    total: float
    free: float
    ours: float


def _report(message: str) -> _Report | None:
    """The report in ``message``; None where it does not say (another allocator or version)."""
    found = _REPORT.search(message)
    if found is None:
        return None
    values = found.groups()
    return _Report(*(float(values[i]) * 2 ** _UNITS[values[i + 1]] for i in range(0, 8, 2)))


def _beyond(report: _Report | None) -> str:
    """``beyond_others`` of a read report."""
    if report is None:
        return ""
    others = max(0.0, report.total - report.free - report.ours)
    if report.asked <= report.free + others:
        return ""
    gib = 2.0**30
    return (
        f"it asks {report.asked / gib:.2f} GiB where {report.free / gib:.2f} GiB is free and other"
        f" processes hold {others / gib:.2f} GiB (this one {report.ours / gib:.2f} GiB)"
    )
