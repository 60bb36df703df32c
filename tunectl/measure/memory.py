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


def when_memory_frees(build: Callable[[], T], device: str) -> T:
    """``build()``; while it runs out of device memory that other processes hold (compile processes
    building beside this worker give theirs back after each build), wait and try again, for up to
    ``MEMORY_WAIT_S``; past that, raise as it does."""
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
        release(device)  # outside the handler: the failed attempt's tensors are gone by now
        time.sleep(pause)
        waited, pause = waited + pause, min(2 * pause, 4.0)
