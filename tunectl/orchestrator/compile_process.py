"""The compile process: a Ray actor on a node's CPU cores that builds kernels into the on-disk caches.

Builders run beside the measuring workers of their node, one process each, so that a worker only
loads what they built. A builder holds no GPU in Ray's accounting (``num_gpus=0``) but sees the
node's devices (a compile for a GPU needs the device's architecture, and a kernel that compiles on
its first call must be called once); it spreads its work over them by its index.

A build that raises is an answer (``compile_error``, or ``invalid`` where the kernel rejects the
config); a builder that dies or hangs is restarted by Ray, and the driver decides what that means
for the kernel it was building (``tunectl.orchestrator.compile_schedule``). A builder never touches a
measuring worker.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

import ray

from tunectl.core.keys import Key
from tunectl.core.plan import WorkItem

#: exit status of a builder that leaves because its CUDA context is unusable
POISONED_EXIT_CODE = 70


@dataclass(frozen=True)
class BuildResult:
    key: str
    status: str  # ok | invalid | compile_error
    seconds: float
    message: str = ""
    host: str = ""


@ray.remote(max_restarts=-1, max_task_retries=0)
class Builder:
    """One compile process. ``build`` calls run one at a time."""

    def __init__(self, index: int) -> None:
        from tunectl.orchestrator.notes import install
        from tunectl.tasks.compile import build_device

        self.notes = install(output=True)  # warnings, library logs, prints: the run's log, not the console
        self.index = index

        self.device = build_device(index)
        self._tasks: dict[str, Any] = {}
        self._point: Any = None
        self._inputs: Any = None

    def close(self) -> list[Any]:
        """What this process noted on the side (``tunectl.orchestrator.notes``), at the run's end."""
        return self.notes.drain(f"compile process pid {os.getpid()} on {socket.gethostname()}")

    def describe(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "device": self.device,
        }

    def build(self, key: str, item: WorkItem, arm: Key) -> BuildResult:
        """Compile the kernel of config ``arm`` (the item's, or one of its arms') at ``item``'s point."""
        from tunectl.core.registry import get_task
        from tunectl.measure.build_memory import remembered
        from tunectl.measure.failures import clip, failure_message
        from tunectl.tasks import compile as build_api
        from tunectl.tasks.base import InvalidConfig

        task = self._tasks.get(item.task) or self._tasks.setdefault(item.task, get_task(item.task))
        static, shape, config = dict(item.static), dict(item.shape), dict(arm)
        host = socket.gethostname()

        def inputs_for(static: Any, shape: Any) -> Any:
            return self._inputs_for(task, static, shape)

        # A kernel built at a smaller point than the item's can fail there for reasons of that point:
        # then the items find out for themselves (their workers compile what is left).
        own_point = task.build_shape(static, shape, config) == shape
        try:
            with remembered(task, static, shape, config, self.device, remember=own_point):
                seconds = build_api.build(task, static, shape, config, self.device, inputs_for)
        except InvalidConfig as exc:
            return BuildResult(key, "invalid" if own_point else "ok", 0.0, clip(str(exc)), host)
        except Exception as exc:
            self._check_context()
            message = failure_message(exc)
            # Out of device memory here (beside the measuring workers) says nothing of the kernel: its
            # worker compiles it itself, as without compile processes.
            failed = own_point and not build_api.out_of_memory(exc)
            return BuildResult(key, "compile_error" if failed else "ok", 0.0, message, host)
        finally:
            build_api.release(self.device)
        return BuildResult(key, "ok", seconds, "", host)

    def idle(self) -> None:
        """No build is pending: let go of the last point's inputs (up to the largest point's KV cache,
        on the device the measuring workers use) until a build needs a point again."""
        from tunectl.tasks.compile import release

        self._point, self._inputs = None, None
        release(self.device)

    def _inputs_for(self, task: Any, static: Any, shape: Any) -> Any:
        """The point's inputs, kept while consecutive builds share the point (as a worker keeps them)."""
        point = (task.name, sorted(static.items()), sorted(shape.items()))
        if point != self._point:
            self._point, self._inputs = None, None  # free the old point first
            self._inputs = task.build_inputs(dict(static), dict(shape), self.device)
            self._point = point
        return self._inputs

    def _check_context(self) -> None:
        """After a failure, a poisoned CUDA context fails every later build: leave, Ray restarts us."""
        from tunectl.tasks.compile import device_healthy

        if not device_healthy(self.device):
            os._exit(POISONED_EXIT_CODE)
