"""Building a point's inputs while other processes on the device hold memory for a while."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from tunectl.tasks.compile import out_of_memory, release

log = logging.getLogger("tunectl.worker")
T = TypeVar("T")

#: how long a point's set-up waits for device memory held by other processes before its items fail
MEMORY_WAIT_S = 60.0


def when_memory_frees(
    build: Callable[[], T], device: str, make_room: Callable[[], bool] = lambda: False
) -> T:
    """``build()``; while it runs out of device memory that other processes hold (compile processes
    building beside this worker give theirs back after each build), wait and try again, for up to
    ``MEMORY_WAIT_S``; past that, raise as it does. ``make_room`` lets go of what this process keeps
    and could do without (the points it keeps built), before each try; where it let something go, the
    next try comes at once."""
    waited, pause = 0.0, 0.25
    while True:
        try:
            return build()
        except Exception as exc:
            if not out_of_memory(exc) or waited >= MEMORY_WAIT_S:
                raise
            log.warning(
                "out of device memory on %s, waiting %.2f s: %s",
                device,
                pause,
                (str(exc).splitlines() or [""])[0],
            )
        freed = make_room()
        release(device)  # outside the handler: the failed attempt's tensors are gone by now
        if freed:
            continue
        time.sleep(pause)
        waited, pause = waited + pause, min(2 * pause, 4.0)


def short_of_memory(device: str, share: float) -> bool:
    """Whether ``device`` has less than ``share`` of its memory free or cached unallocated (a CPU never
    is: what it keeps is bounded by count alone)."""
    if not device.startswith("cuda"):
        return False
    import torch

    free, total = torch.cuda.mem_get_info(device)
    idle = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return bool(free + idle < share * total)
