"""Runs one work item in a worker: inputs, correctness check, measurement, record.

Inputs and the reference output are built once per (static, shape) point and kept while
consecutive items share that point. A config is prepared (compiled) and run once, its output
checked against the reference, and only then timed. Nothing here raises for a bad config: every
outcome becomes a ``Record`` with a status.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

from tasks.base import InvalidConfig, TuningTask
from tasks.env import env_json, environment
from tasks.harness import measure
from tasks.nvml import read_state, record_fields
from tasks.registry import get_task
from tasks.timing import make_sampler
from tunectl.keys import key_text
from tunectl.plan import WorkItem
from tunectl.record import Record
from tunectl.spec import MeasureSpec

_MESSAGE_CHARS = 2000


class CudaContextPoisoned(RuntimeError):
    """A kernel left the CUDA context unusable; the worker process must exit."""


class ItemRunner:
    """Evaluates work items on one device. One per worker process."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self._tasks: dict[str, TuningTask] = {}
        self._point: tuple[Any, ...] | None = None
        self._inputs: Any = None
        self._reference: Any = None

    @classmethod
    def for_process(cls, gpu_assigned: bool, num_threads: int) -> ItemRunner:
        """A runner on this process's GPU if it was given one torch can use, else on ``num_threads`` CPUs."""
        import torch

        device = "cuda:0" if gpu_assigned and torch.cuda.is_available() else "cpu"
        if device == "cpu":
            torch.set_num_threads(max(1, num_threads))
        return cls(device)

    def run(self, run_id: str, item: WorkItem, settings: MeasureSpec) -> Record:
        started = time.time()
        task = self._task(item.task)
        static, shape, config = dict(item.static), dict(item.shape), dict(item.config)
        mode = settings.mode if settings.mode != "auto" else getattr(task, "serving_mode", "eager")
        if not self.device.startswith("cuda"):
            mode = "eager"
        base: dict[str, Any] = dict(
            run_id=run_id,
            item_id=item.item_id,
            task=item.task,
            static_key=key_text(item.static),
            shape_key=key_text(item.shape),
            config_key=key_text(item.config),
            is_default=item.is_default,
            measure_mode=mode,
            l2=settings.l2,
            bytes_moved=task.bytes_moved(static, shape) or None,
            device_name=str(environment(self.device).get("device_name", "")),
            device_kind=self.device.split(":")[0],
            host=socket.gethostname(),
            worker=f"{socket.gethostname()}:{os.getpid()}",
            env_json=env_json(self.device),
            started_at=started,
        )
        try:
            fields = self._evaluate(task, item, static, shape, config, settings, mode)
        except InvalidConfig as exc:
            fields = {"status": "invalid", "message": _clip(str(exc))}
        except Exception as exc:  # a failing config is data, not a failure of the run
            self._check_context()
            fields = {"status": "error", "message": _clip(f"{type(exc).__name__}: {exc}\n{_tail(exc)}")}
        return Record(**base, **fields, finished_at=time.time())

    def _task(self, name: str) -> TuningTask:
        if name not in self._tasks:
            self._tasks[name] = get_task(name)
        return self._tasks[name]

    def _evaluate(
        self,
        task: TuningTask,
        item: WorkItem,
        static: dict[str, Any],
        shape: dict[str, Any],
        config: dict[str, Any],
        settings: MeasureSpec,
        mode: str,
    ) -> dict[str, Any]:
        point = (item.task, item.static, item.shape)
        if point != self._point:
            self._point, self._inputs, self._reference = None, None, None  # free the old point first
            inputs = task.build_inputs(static, shape, self.device)
            self._reference = task.reference(static, shape, inputs)
            self._inputs, self._point = inputs, point
        fn, prepare_s = self._prepare(task, item, static, shape, config)
        t0 = time.perf_counter()
        out = fn()
        self._synchronize()
        compile_ms = (prepare_s + time.perf_counter() - t0) * 1e3
        atol, rtol = task.tolerance(static)
        err, ok = _compare(out, self._reference, atol, rtol)
        if not ok:
            return {
                "status": "wrong_result",
                "max_abs_err": err,
                "compile_ms": compile_ms,
                "message": f"max abs error {err:.3g} exceeds atol={atol:g} rtol={rtol:g}",
            }
        sampler = make_sampler(fn, self.device, mode, settings.l2)
        before = read_state(self.device)
        stats = measure(sampler, settings)
        gpu_state = record_fields(before, read_state(self.device))
        return {
            "status": "ok",
            "max_abs_err": err,
            "compile_ms": compile_ms,
            "median_us": stats.median_us,
            "p20_us": stats.p20_us,
            "p80_us": stats.p80_us,
            "mean_us": stats.mean_us,
            "min_us": stats.min_us,
            "max_us": stats.max_us,
            "num_samples": stats.num_samples,
            "rel_noise": stats.rel_noise,
            **gpu_state,
        }

    def _prepare(
        self,
        task: TuningTask,
        item: WorkItem,
        static: dict[str, Any],
        shape: dict[str, Any],
        config: dict[str, Any],
    ) -> tuple[Callable[[], Any], float]:
        """The item's kernel call and the seconds preparing it took. A subclass may prepare ahead."""
        t0 = time.perf_counter()
        fn = task.prepare(static, shape, config, self._inputs)
        return fn, time.perf_counter() - t0

    def _synchronize(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(self.device)

    def _check_context(self) -> None:
        """After a failure on CUDA, a sticky error (illegal address) makes every later call fail."""
        if not self.device.startswith("cuda"):
            return
        try:
            self._synchronize()
        except Exception as exc:
            raise CudaContextPoisoned(str(exc)) from exc


def _compare(out: Any, ref: Any, atol: float, rtol: float) -> tuple[float, bool]:
    import torch

    if not isinstance(out, torch.Tensor) or out.shape != ref.shape:
        return float("inf"), False
    diff = (out.double() - ref.double().to(out.device)).abs()
    err = float(diff.max()) if diff.numel() else 0.0
    if not torch.isfinite(out).all():
        return float("inf"), False
    ok = bool((diff <= atol + rtol * ref.double().to(out.device).abs()).all())
    return err, ok


def _clip(text: str) -> str:
    """Keep the head (what failed) and the tail (compilers put the root cause last) of a long message."""
    if len(text) <= _MESSAGE_CHARS:
        return text
    half = (_MESSAGE_CHARS - 5) // 2
    return f"{text[:half]}\n...\n{text[-half:]}"


def _tail(exc: BaseException) -> str:
    return "".join(traceback.format_tb(exc.__traceback__)[-2:])
