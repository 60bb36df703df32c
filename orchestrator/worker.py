"""The worker actor: owns one device (one GPU, or a GPU-less node's cores) and measures items on it."""

from __future__ import annotations

import os
import socket
from typing import Any

import ray

from tunectl.plan import WorkItem
from tunectl.record import Record
from tunectl.spec import MeasureSpec


@ray.remote(max_restarts=-1, max_task_retries=0)
class TuneWorker:
    """One per device. A crash restarts it (Ray); the driver decides what happens to the item."""

    def __init__(self, num_threads: int) -> None:
        from tasks.runner import runner_for_worker

        self.runner = runner_for_worker(bool(ray.get_gpu_ids()), num_threads)
        self.device = self.runner.device

    def describe(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "device": self.device,
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "accelerator_ids": {k: list(v) for k, v in ctx.get_accelerator_ids().items()},
        }

    def run(self, run_id: str, item: WorkItem, settings: MeasureSpec) -> Record:
        from tasks.runner import CudaContextPoisoned

        try:
            return self.runner.run(run_id, item, settings)
        except CudaContextPoisoned:
            # Every later call on this context would fail: leave, and let Ray start a fresh process.
            os._exit(70)
