"""A local Ray instance's processes, stopped when the driver that started it dies. Standard library only.

``ray.init(address="local")`` starts the instance's processes as the driver's children. When the driver
is killed outright (SIGKILL, the OOM killer), Ray stops its GCS, raylet and workers within seconds,
but its dashboard and runtime-env processes, finding their raylet gone, first report that to the GCS,
which is gone too, and wait 60 s for it (a timeout fixed inside Ray). So a driver that starts a local
instance also starts this watcher (out of reach of its terminal's Ctrl-C), holding the write end of
its stdin: it notes every process under the instance's root processes, and when stdin reaches its
end (the driver is gone, however it went) it stops those still running, SIGTERM first, then SIGKILL.
It leaves by itself once none of the instance's processes is left (``ray.shutdown``). Linux only
(``/proc``); elsewhere nothing is watched.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO

POLL_S = 1.0  # how often the instance's processes are listed (a few ms of /proc reads)
GRACE_S = 1.0  # after the driver is gone: time for Ray's own stopping to finish
TERM_WAIT_S = 3.0  # after SIGTERM, before SIGKILL

_PROC = Path("/proc")
_watchers: list[subprocess.Popen[bytes]] = []  # kept so that their stdin stays open with the driver


def watch(root_pids: Iterable[int]) -> subprocess.Popen[bytes] | None:
    """Start a watcher over ``root_pids`` and what runs under them, for as long as this process
    lives. None where there is no ``/proc``, or nothing to watch."""
    roots = sorted({int(pid) for pid in root_pids})
    if not roots or not _PROC.is_dir():
        return None
    watcher = subprocess.Popen(
        [sys.executable, "-m", "tunectl.orchestrator.reaper", *map(str, roots)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the driver's terminal does not stop the watcher
    )
    _watchers.append(watcher)
    return watcher


def stat_of(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a running process, or None."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()  # the name, in parentheses, may hold spaces
    if fields[0] == "Z":
        return None  # a zombie has already ended
    return int(fields[1]), int(fields[19])


def tree(roots: Iterable[int]) -> dict[int, int]:
    """pid -> start time of ``roots`` and every process under them, now."""
    table: dict[int, tuple[int, int]] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and (stat := stat_of(int(entry.name))) is not None:
            table[int(entry.name)] = stat
    found = {pid: table[pid][1] for pid in roots if pid in table}
    grown = True
    while grown:
        below = {pid: start for pid, (ppid, start) in table.items() if ppid in found and pid not in found}
        found.update(below)
        grown = bool(below)
    return found


def alive(known: Mapping[int, int]) -> list[int]:
    """Those of ``known`` still running as the same process (its start time unchanged)."""
    return [pid for pid, start in known.items() if (stat := stat_of(pid)) is not None and stat[1] == start]


def stop(known: Mapping[int, int], term_wait_s: float = TERM_WAIT_S) -> list[int]:
    """SIGTERM the processes of ``known`` still running, then SIGKILL those left after ``term_wait_s``;
    the pids signalled."""
    signalled = alive(known)
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive(known):
            with contextlib.suppress(OSError):  # ended meanwhile
                os.kill(pid, signum)
        deadline = time.monotonic() + term_wait_s
        while alive(known) and time.monotonic() < deadline:
            time.sleep(0.05)
    return signalled


def run(roots: list[int], driver: IO[bytes], poll_s: float = POLL_S, grace_s: float = GRACE_S) -> None:
    """Note the processes under ``roots`` until ``driver`` reaches its end, then stop them; return
    early once none is left."""
    known = tree(roots)
    while alive(known):
        ready, _, _ = select.select([driver], [], [], poll_s)
        if ready and not os.read(driver.fileno(), 4096):
            time.sleep(grace_s)
            stop(known)
            return
        known.update(tree(roots))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    run([int(arg) for arg in sys.argv[1:]], sys.stdin.buffer)
