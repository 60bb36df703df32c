"""Building a point's inputs while other processes on the device hold memory for a while.

A wait for memory that other processes hold (compile processes keep a point's inputs while they build
its kernels, 8 GiB at batch 64 x 32768) reads the device's free memory every ``POLL_S`` and tries
again as soon as the device has gained what the failed request lacked, not at the end of its pause:
on an H100 80GB, pauses of 0.25 to 4 s held a look 7.75 s for memory the compile processes gave back
within them. What it lacked is counted from the free memory after the failed attempt let go of its
own tensors (an expanding config builds K, 16 GiB, then fails to get V): those come back before the
retry takes them again, so they are no sign that anyone else let go."""

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
#: the lines a worker logs (``tunectl.worker``) of a request out of memory, read back by ``logged``
_WAITED = "out of device memory on %s, waited %.2f s of up to %.2f s: %s"
_NOT_WAITING = "out of device memory on %s, not waiting: %s"
_LOGGED = re.compile(
    r"out of device memory on \S+, (?:waited ([0-9.]+) s of up to [0-9.]+ s|(not waiting)): "
)


def when_memory_frees(
    build: Callable[[], T], device: str, make_room: Callable[[], bool] = lambda: False
) -> T:
    """``build()``; while it runs out of device memory that other processes hold (compile processes
    building beside this worker give theirs back after each build), wait and try again, for up to
    ``MEMORY_WAIT_S``; past that, raise as it does. ``make_room`` lets go of what this process keeps
    and could do without (the points it keeps built), before each try; where it let something go, the
    next try comes at once. Where the failed request is more than the device had free and all that the
    other processes could give back (``beyond_others``), no wait can make it fit: it raises at once.
    Each wait and each such failure is logged (``logged`` reads the lines back)."""
    waited, pause = 0.0, 0.25
    while True:
        try:
            return build()
        except Exception as exc:
            if not out_of_memory(exc) or waited >= MEMORY_WAIT_S:
                raise
            report, said = _report(str(exc)), (str(exc).splitlines() or [""])[0]
            hopeless, freed = _beyond(report), make_room()
            if hopeless and not freed:
                log.warning(_NOT_WAITING, device, hopeless)
                raise
        release(device)  # outside the handler: the failed attempt's tensors are gone by now
        if freed:
            continue
        took = until_free(device, report.asked - report.free if report else None, pause)
        log.warning(_WAITED, device, took, pause, said)
        waited, pause = waited + took, min(2 * pause, 4.0)


def until_free(device: str, lacked: float | None, pause: float) -> float:
    """Wait up to ``pause`` seconds, returning as soon as ``device`` has ``lacked`` bytes more free than
    it has now (read every ``POLL_S``); the seconds waited. The whole pause where nothing was lacked (the
    request failed with that much free: fragmentation, which only time may mend) or where the size or
    the device's free memory cannot be read."""
    if lacked is None or lacked <= 0 or not device.startswith("cuda"):
        time.sleep(pause)
        return pause
    wanted, waited = free_bytes(device) + lacked, 0.0
    while waited < pause and free_bytes(device) < wanted:
        step = min(POLL_S, pause - waited)
        time.sleep(step)
        waited += step
    return waited


class Logged(NamedTuple):
    """What a line ``when_memory_frees`` logged says: the seconds a wait for memory lasted, or that the
    request failed at once (nothing any process could free would fit it)."""

    waited_s: float
    refused: bool


def logged(text: str) -> Logged | None:
    """What ``text`` says, if ``when_memory_frees`` logged it; None for any other text."""
    found = _LOGGED.match(text)
    if found is None:
        return None
    return Logged(float(found.group(1) or 0.0), refused=found.group(2) is not None)


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
# ... and, of each other process on the device, "Process 5749 has 9.08 GiB memory in use"
_OTHER = re.compile(rf"Process \d+ has {_SIZE} memory in use")


def beyond_others(message: str) -> str:
    """Why waiting for other processes cannot satisfy the failed request ``message`` reports: it asks
    more than was free plus all that the other processes on the device could give back (even were they
    all to let go, it would not fit); empty where it could, or where the message does not say (another
    allocator or version: then waiting is tried as before). A process listed in the report keeps its
    CUDA context and libraries while it lives (614 MiB a compile process on an H100): as much as the
    least any of them holds, at most ``CONTEXT_BYTES``, is not counted as something it could give back."""
    return _beyond(_report(message))


#: the most a process's CUDA context and libraries are taken to hold (``beyond_others``)
CONTEXT_BYTES = 2.0**30


class _Report(NamedTuple):
    """torch's report of a failed request, in bytes: the size asked, the device's capacity, its free
    memory, what this process holds, and what each other process it lists holds."""

    asked: float
    total: float
    free: float
    ours: float
    listed: tuple[float, ...]


def _bytes(value: str, unit: str) -> float:
    return float(value) * 2 ** _UNITS[unit]


def _report(message: str) -> _Report | None:
    """The report in ``message``; None where it does not say (another allocator or version)."""
    found = _REPORT.search(message)
    if found is None:
        return None
    values = found.groups()
    asked, total, free, ours = (_bytes(values[i], values[i + 1]) for i in range(0, 8, 2))
    listed = tuple(_bytes(*sizes) for sizes in _OTHER.findall(message))
    return _Report(asked, total, free, ours, listed)


def _beyond(report: _Report | None) -> str:
    """``beyond_others`` of a read report."""
    if report is None:
        return ""
    others = max(0.0, report.total - report.free - report.ours)
    kept = min([*report.listed, CONTEXT_BYTES]) * len(report.listed)
    if report.asked <= report.free + max(0.0, others - kept):
        return ""
    gib, n = 2.0**30, len(report.listed)
    holders = f"{n} other process{'es' if n != 1 else ''}, contexts included," if n else "other processes"
    return (
        f"it asks {report.asked / gib:.2f} GiB where {report.free / gib:.2f} GiB is free and {holders}"
        f" hold {others / gib:.2f} GiB (this one {report.ours / gib:.2f} GiB)"
    )
