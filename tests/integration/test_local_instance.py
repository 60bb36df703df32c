"""A local Ray instance goes with the driver that started it, even one killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunectl.orchestrator.reaper import alive, tree

pytestmark = pytest.mark.slow

DRIVER = """
import ray
from tunectl.orchestrator.cluster import connect

connect(None, num_cpus=1)

@ray.remote
class Idle:
    def pid(self):
        import os
        return os.getpid()

idle = Idle.remote()
print(ray.get(idle.pid.remote()), flush=True)
import time
time.sleep(120)
"""


def test_every_process_of_a_local_instance_ends_soon_after_its_driver_is_killed() -> None:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert driver.stdout is not None
        actor_pid = int(driver.stdout.readline())
        instance = tree([driver.pid])
        # GCS, raylet, the dashboard's and runtime env's processes, the actor
        assert actor_pid in instance and len(instance) >= 5
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    del instance[driver.pid]
    deadline = time.monotonic() + 20
    while alive(instance) and time.monotonic() < deadline:
        time.sleep(0.25)
    left = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid in alive(instance)}
    assert not left, f"still running 20 s after the driver was killed: {left}"
