"""The watcher that stops a local instance's processes when its driver is gone, on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tunectl.orchestrator import reaper

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="the watcher reads /proc")

# a parent with a child and a grandchild, each ignoring SIGTERM as a stuck Ray process might
FAMILY = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
depth = int(sys.argv[1])
if depth:
    subprocess.Popen([sys.executable, "-c", sys.argv[2], str(depth - 1), sys.argv[2]])
time.sleep(60)
"""


@pytest.fixture
def family() -> Iterator[subprocess.Popen[bytes]]:
    root = subprocess.Popen([sys.executable, "-c", FAMILY, "2", FAMILY])
    deadline = time.monotonic() + 10
    while len(reaper.tree([root.pid])) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield root
    for pid in reaper.alive(reaper.tree([root.pid])):
        os.kill(pid, 9)
    root.wait()


def test_the_tree_holds_a_root_and_everything_under_it(family: subprocess.Popen[bytes]) -> None:
    found = reaper.tree([family.pid])
    assert family.pid in found and len(found) == 3
    assert reaper.tree([2**22 + 7]) == {}  # no such process


def test_stopping_ends_processes_that_ignore_sigterm(family: subprocess.Popen[bytes]) -> None:
    found = reaper.tree([family.pid])
    started = time.monotonic()
    assert sorted(reaper.stop(found, term_wait_s=0.3)) == sorted(found)
    family.wait(timeout=5)
    assert not reaper.alive(found) and time.monotonic() - started < 3


def test_the_processes_are_stopped_once_the_driver_is_gone(family: subprocess.Popen[bytes]) -> None:
    read_end, write_end = os.pipe()
    found = reaper.tree([family.pid])
    with os.fdopen(read_end, "rb") as driver:
        watcher = threading.Thread(target=reaper.run, args=([family.pid], driver, 0.05, 0.0))
        watcher.start()
        time.sleep(0.2)
        assert reaper.alive(found) and watcher.is_alive()  # the driver lives: nothing is touched
        os.close(write_end)  # what the driver's death does to the pipe
        watcher.join(timeout=10)
    family.wait(timeout=5)
    assert not watcher.is_alive() and not reaper.alive(found)


def test_the_watcher_leaves_once_the_instance_ended_by_itself() -> None:
    short = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as driver:
        started = time.monotonic()
        reaper.run([short.pid], driver, poll_s=0.05)
        assert time.monotonic() - started < 5
    os.close(write_end)
    short.wait()


def test_a_process_started_under_a_reused_pid_is_not_taken_for_the_old_one() -> None:
    me = reaper.tree([os.getpid()])
    assert os.getpid() in reaper.alive(me)
    assert reaper.alive({os.getpid(): me[os.getpid()] + 1}) == []
