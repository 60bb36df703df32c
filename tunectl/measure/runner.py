"""Runs one work item in a worker: inputs, correctness check, measurement, record.

Inputs and the reference output are built once per (static, shape) point and kept while
consecutive items share that point. A config is prepared (compiled) and run once, its output
checked against the reference, and only then timed. Nothing here raises for a bad config: every
outcome becomes a ``Record`` with a status.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from tunectl.core.keys import key_text
from tunectl.core.plan import WorkItem, member_id
from tunectl.core.record import Record
from tunectl.core.spec import MeasureSpec
from tunectl.measure.built import Built, PointKernels, with_warmup
from tunectl.measure.drift import MAX_WAIT_S, DriftGuard, Probe, probe_sampler
from tunectl.measure.failures import clip, failure_message
from tunectl.measure.harness import Sampler, Stats, interleave, measure, scaled, take
from tunectl.measure.memory import when_memory_frees
from tunectl.measure.nvml import read_state, record_fields
from tunectl.measure.rounds import NOT_MEASURABLE, NotMeasurable, arm_stats, round_times
from tunectl.measure.timing import make_sampler, stack_sampler, timing_of
from tunectl.tasks.base import InvalidConfig, TuningTask, compare_outputs
from tunectl.tasks.env import env_json, environment
from tunectl.tasks.registry import get_task

log = logging.getLogger("tunectl.worker")
_STACK_MEMORY_SHARE = 0.3  # of the free device memory, for a stack's extra input sets
_CPU_STACK_BYTES = 1 << 30
_NO_BASELINE = {"status": "error", "message": "not compared: the default failed at this point"}
_CRASHED_ARM = {
    "status": "crash",
    "message": "the worker process died while this config was checked at this point; "
    "the comparison went on without it",
}


#: the statistics of a measurement that raised (its record carries the failure instead)
FAILED_STATS = Stats(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, math.inf, 0.0)

#: a device state read this recently stands for the reading before the next measurement (seconds)
STATE_REUSE_S = 1.0


class CudaContextPoisoned(RuntimeError):
    """A kernel left the CUDA context unusable; the worker process must exit."""


class ItemRunner:
    """Evaluates work items on one device. One per worker process."""

    def __init__(self, device: str = "cpu", *, probe: Callable[[str], Probe] = probe_sampler) -> None:
        """``probe`` makes the drift guard's probe samplers for a device (``tunectl.measure.drift``)."""
        self.device = device
        self._make_probe = probe
        self._guard: DriftGuard | None = None
        self._probe_failed = False
        self._tasks: dict[str, TuningTask] = {}
        self._point: tuple[Any, ...] | None = None
        self._inputs: Any = None
        self._reference: Any = None
        self._kernels = PointKernels()  # the point's checked configs and their samplers
        self._state: tuple[float, Any] = (-math.inf, None)  # (when, the device state read then)
        #: the item this worker gets after the current call, where the dispatcher says (its lookahead)
        self.next_item: WorkItem | None = None
        #: told which arm of a comparison is being checked (its index), and None once all are timed
        self.on_arm: Callable[[int | None], None] = _nothing
        #: told which member of a plain item or a batch is being checked or timed (its item id)
        self.on_member: Callable[[str], None] = _nothing

    @classmethod
    def for_process(cls, gpu_assigned: bool, num_threads: int) -> ItemRunner:
        """A runner on this process's GPU if it was given one torch can use, else on ``num_threads`` CPUs."""
        import torch

        device = "cuda:0" if gpu_assigned and torch.cuda.is_available() else "cpu"
        if device == "cpu":
            torch.set_num_threads(max(1, num_threads))
        return cls(device)

    def run(self, run_id: str, item: WorkItem, settings: MeasureSpec) -> Record | list[Record]:
        """The item's record; a comparison item (``item.arms``) gives one record per arm."""
        started = time.time()
        task = self._task(item.task)
        static, shape = dict(item.static), dict(item.shape)
        mode = settings.mode if settings.mode != "auto" else task.serving_mode
        if not self.device.startswith("cuda"):
            mode = "eager"
        base: dict[str, Any] = dict(
            run_id=run_id,
            task=item.task,
            static_key=key_text(item.static),
            shape_key=key_text(item.shape),
            measure_mode=mode,
            timing=timing_of(self.device, settings.l2, settings.timing),
            l2=settings.l2,
            phase=item.phase,
            rung=item.rung,
            bytes_moved=task.bytes_moved(static, shape) or None,
            device_name=str(environment(self.device).get("device_name", "")),
            device_kind=self.device.split(":")[0],
            host=socket.gethostname(),
            worker=f"{socket.gethostname()}:{os.getpid()}",
            env_json=env_json(self.device),
            started_at=started,
        )
        if item.arms:
            arms = self._guarded(lambda: self._compare(task, item, settings, mode), len(item.arms))
            base.update(group_id=item.item_id, rounds=item.rounds, layers=item.layers or None)
            return [
                Record(**base, item_id=member_id(item.item_id, arm), config_key=key_text(arm),
                       is_default=i == 0, **fields, finished_at=time.time())
                for i, (arm, fields) in enumerate(zip(item.arms, arms, strict=True))
            ]  # fmt: skip
        members = item.members or (item,)  # a batch: plain items at this point, each its own record
        scaled_settings = scaled(settings, item.budget)
        fields = self._guarded(lambda: self._measure_each(task, item, scaled_settings, mode), len(members))
        records = [
            Record(**base, item_id=m.item_id, config_key=key_text(m.config), is_default=m.is_default,
                   **f, finished_at=time.time())
            for m, f in zip(members, fields, strict=True)
        ]  # fmt: skip
        return records if item.members else records[0]

    def _guarded(self, evaluate: Callable[[], list[dict[str, Any]]], n: int) -> list[dict[str, Any]]:
        """``evaluate``'s fields; a config that fails is data (a status), never a failure of the run."""
        try:
            return evaluate()
        except Exception as exc:
            return [self._failed(exc)] * n

    def _failed(self, exc: Exception) -> dict[str, Any]:
        """The record fields of a config that raised ``exc`` (re-raised where the context is lost)."""
        if isinstance(exc, InvalidConfig):
            return {"status": "invalid", "message": clip(str(exc))}
        if isinstance(exc, NotMeasurable):  # the numbers are fine, the method cannot resolve them: no trace
            return {"status": "error", "message": str(exc)}
        self._check_context()
        return {"status": "error", "message": failure_message(exc)}

    def _task(self, name: str) -> TuningTask:
        if name not in self._tasks:
            self._tasks[name] = get_task(name)
        return self._tasks[name]

    def _measure_each(
        self, task: TuningTask, item: WorkItem, settings: MeasureSpec, mode: str
    ) -> list[dict[str, Any]]:
        """Fields per member of a plain item or a batch: each checked, then each measured on its own,
        under one drift guard bracket (``DriftGuard.measure_many``)."""
        members = item.members or (item,)
        setup_ms = self._load_point(task, item) * 1e3
        static, shape = dict(item.static), dict(item.shape)
        fields: list[dict[str, Any]] = []
        timed: list[tuple[int, Sampler, MeasureSpec]] = []
        for i, m in enumerate(members):
            self.on_member(m.item_id)
            mine = len(fields)
            then = members[i + 1] if i + 1 < len(members) else self.next_item
            try:
                built, checked = self._built(task, m.config, static, shape, dict(m.config), (m, then))
                fields.append(checked)
                if built is not None:
                    timed.append((len(fields) - 1, *self._sampler(built, settings, mode)))
            except Exception as exc:
                fields[mine:] = [self._failed(exc)]
        fields[0] = {**fields[0], "setup_ms": setup_ms}  # the point's set-up, paid once
        before = self._state_before()
        measured = self._measured(item, [(self._noting(members[i].item_id, s), st) for i, s, st in timed])
        self._state = (time.perf_counter(), read_state(self.device))
        gpu_state = record_fields(before, self._state[1])
        for (i, sampler, _), (stats, extra) in zip(timed, measured, strict=True):
            fields[i] = {**fields[i], **self._stat_fields(stats, sampler, extra), **gpu_state}
        return fields

    def _sampler(self, built: Built, settings: MeasureSpec, mode: str) -> tuple[Sampler, MeasureSpec]:
        """A checked config's sampler (built once at the point) and its settings with the warm-up it
        needs now."""
        how = (mode, settings.l2, settings.timing)
        sampler = built.sampler(
            how, lambda: make_sampler(built.call, self.device, mode, settings.l2, settings.timing)
        )
        return sampler, with_warmup(settings, built.warmup(how, settings, graph=self._graphs(mode)))

    def _measured(
        self, item: WorkItem, timed: list[tuple[Sampler, MeasureSpec]]
    ) -> list[tuple[Stats, dict[str, Any]]]:
        """Each sampler measured, with the drift guard's fields (under one bracket when guarded).
        Where the batch raises, each is measured alone, so a failure is charged to its config only."""
        guard = self._drift_guard(timed[0][1].drift) if timed else None
        try:
            if guard is None:
                return [(measure(s, st), {}) for s, st in timed]
            return [(g.stats, g.fields()) for g in guard.measure_many((item.task, *item.point), timed)]
        except Exception:
            if len(timed) == 1:
                raise
        return [self._measured_alone(item, s, st) for s, st in timed]

    def _measured_alone(
        self, item: WorkItem, sampler: Sampler, settings: MeasureSpec
    ) -> tuple[Stats, dict[str, Any]]:
        try:
            [out] = self._measured(item, [(sampler, settings)])
            return out
        except Exception as exc:
            return FAILED_STATS, self._failed(exc)

    def _stat_fields(self, stats: Stats, sampler: Sampler, extra: dict[str, Any]) -> dict[str, Any]:
        """A measurement's record fields (``extra``: the guard's, or a failure's)."""
        if stats is FAILED_STATS:
            return extra
        if stats.median_us <= 0:
            return {"status": "error", "message": f"{NOT_MEASURABLE} (median {stats.median_us:.3g} us)"}
        guard_ms = extra.get("guard_ms") or 0.0
        return {
            "status": "ok", "median_us": stats.median_us, "p20_us": stats.p20_us, "p80_us": stats.p80_us,
            "mean_us": stats.mean_us, "min_us": stats.min_us, "max_us": stats.max_us,
            "num_samples": stats.num_samples, "calls_per_sample": calls_per_sample(sampler),
            "rel_noise": stats.rel_noise, "measure_ms": stats.seconds * 1e3 + guard_ms, **extra,
        }  # fmt: skip

    def _noting(self, member_id: str, sampler: Sampler) -> Sampler:
        """``sampler``, telling ``on_member`` whose measurement runs as its first samples are taken (a
        worker notes it: a death while timing it is charged to it alone). It takes chunks as
        ``sampler`` does (``tunectl.measure.harness``)."""
        told = False

        def many(n: int) -> list[float]:
            nonlocal told
            if not told:
                told = True
                self.on_member(member_id)
            return take(sampler, n)

        def sample() -> float:
            return many(1)[0]

        sample.many = many  # type: ignore[attr-defined]
        sample.expected_us = getattr(sampler, "expected_us", None)  # type: ignore[attr-defined]
        return sample

    def _built(
        self,
        task: TuningTask,
        config_key: Any,
        static: dict[str, Any],
        shape: dict[str, Any],
        config: dict[str, Any],
        items: tuple[WorkItem, WorkItem | None] | None = None,
    ) -> tuple[Built | None, dict[str, Any]]:
        """The config's checked call at the current point (built once, ``tunectl.measure.built``) and
        the fields its record carries; (None, the failed check's fields) where its output is wrong.
        ``items``: the item it is built for and the one built after it (for ``prepare``)."""
        built = self._kernels.get(config_key)
        if built is not None:
            return built, built.recheck_fields()
        if items is not None:
            fn, prepare_s = self.prepare(task, items[0], static, shape, config, then=items[1])
        else:
            fn, prepare_s = timed_prepare(task, static, shape, config, self._inputs)
        failed, checked = self._check(task, static, fn, prepare_s)
        if failed:
            return None, checked
        return self._kernels.keep(config_key, fn, checked), checked

    def _graphs(self, mode: str) -> bool:
        return mode == "graph" and self.device.startswith("cuda")

    def _state_before(self) -> Any:
        """The device's state before a measurement: the reading after the last one where that is
        recent (items follow each other within milliseconds), so NVML is read once per item."""
        taken, state = self._state
        if time.perf_counter() - taken <= STATE_REUSE_S:
            return state
        return read_state(self.device)

    def _drift_guard(self, action: str) -> DriftGuard | None:
        """The worker's drift guard acting as ``measure.drift`` asks (None for ``off``); its probe is
        built on first use and kept for the worker's life."""
        if action == "off" or self._probe_failed:
            return None
        if self._guard is None:
            try:
                wait = MAX_WAIT_S if self.device.startswith("cuda") else 0.0
                self._guard = DriftGuard(self._make_probe(self.device), action=action, max_wait_s=wait)
            except Exception as exc:  # no probe (memory, a missing op): measure unguarded, not fail
                self._probe_failed = True
                log.warning("drift guard off on %s: its probe could not be built (%s)", self.device, exc)
                return None
        self._guard.action = action
        return self._guard

    def _load_point(self, task: TuningTask, item: WorkItem) -> float:
        """Build the point's inputs and reference, unless the last item was at the same point; the
        seconds that took (0 if it did not)."""
        point = (item.task, item.static, item.shape)
        if point == self._point:
            return 0.0
        started = time.perf_counter()
        self._kernels.at(None)  # its graphs read the old point's inputs: dropped with them
        self._point, self._inputs, self._reference = None, None, None  # free the old point first
        static, shape = dict(item.static), dict(item.shape)

        def build() -> tuple[Any, Any]:
            inputs = task.build_inputs(static, shape, self.device)
            reference = task.reference(static, shape, inputs)
            self._synchronize()
            return inputs, reference

        inputs, self._reference = when_memory_frees(build, self.device)
        self._inputs, self._point = inputs, point
        self._kernels.at(point)
        return time.perf_counter() - started

    def _check(
        self, task: TuningTask, static: dict[str, Any], fn: Callable[[], Any], prepare_s: float
    ) -> tuple[bool, dict[str, Any]]:
        """Run ``fn`` once against the point's reference: (failed, fields for its record)."""
        t0 = time.perf_counter()
        out = fn()
        self._synchronize()
        compile_ms = (prepare_s + time.perf_counter() - t0) * 1e3
        atol, rtol = task.tolerance(static)
        err, ok = compare_outputs(out, self._reference, atol, rtol)
        if ok:
            return False, {"max_abs_err": err, "compile_ms": compile_ms}
        return True, {
            "status": "wrong_result",
            "max_abs_err": err,
            "compile_ms": compile_ms,
            "message": f"max abs error {err:.3g} exceeds atol={atol:g} rtol={rtol:g}",
        }

    def _compare(
        self, task: TuningTask, item: WorkItem, settings: MeasureSpec, mode: str
    ) -> list[dict[str, Any]]:
        """Fields per arm of a comparison item: each arm checked, then all timed in interleaved rounds."""
        static, shape = dict(item.static), dict(item.shape)
        setup_s = self._load_point(task, item)
        stacks = self._layer_inputs(task, item) if item.phase == "validate" else None
        fields: list[dict[str, Any]] = []
        samplers: dict[int, Sampler] = {}  # arms that passed the check
        warmups: list[int] = []  # their warm-up samples
        unbuilt = {arm: {"status": status, "message": message} for arm, status, message in item.unbuilt_arms}
        for i, arm in enumerate(item.arms):
            if arm in item.crashed_arms and i > 0:
                fields.append(dict(_CRASHED_ARM))
                continue
            if arm in unbuilt and i > 0:
                fields.append(dict(unbuilt[arm]))
                continue
            self.on_arm(i)
            try:  # an arm that is invalid here or fails is that arm's status; the others go on
                built, checked = self._built(task, arm, static, shape, dict(arm))
                fields.append(checked)
                if built is not None:
                    samplers[i] = self._arm_sampler(task, item, arm, built, stacks, settings, mode)
                    warmups.append(
                        0
                        if stacks is not None
                        else built.warmup(
                            (mode, settings.l2, settings.timing), settings, graph=self._graphs(mode)
                        )
                    )
            except Exception as exc:
                fields[i:] = [self._failed(exc)]
        self.on_arm(None)
        fields = [{**f, "setup_ms": setup_s * 1e3} for f in fields]
        if 0 not in samplers:  # no baseline: the arms that passed their check are not compared
            return [{**f, **_NO_BASELINE} if i in samplers else f for i, f in enumerate(fields)]
        started = time.perf_counter()
        timed = list(samplers.values())
        if stacks is not None:
            timed.append(stack_sampler([_nothing] * item.layers, self.device, mode, with_calls=False))
            warmups = [settings.warmup] * len(timed)
        seed = int(item.item_id[:12], 16)
        rounds = interleave(timed, item.rounds, settings, seed=seed, warmups=warmups)
        times = round_times(rounds, item.layers if stacks is not None else 0)
        measure_ms = (time.perf_counter() - started) * 1e3
        for (i, sampler), t, r in zip(samplers.items(), times, rounds, strict=False):
            fields[i] = {**fields[i], **arm_stats(times[0], t, r), "measure_ms": measure_ms,
                         "calls_per_sample": calls_per_sample(sampler)}  # fmt: skip
        return fields

    def _arm_sampler(
        self,
        task: TuningTask,
        item: WorkItem,
        arm: Any,
        built: Built,
        stacks: list[Any] | None,
        settings: MeasureSpec,
        mode: str,
    ) -> Sampler:
        """The sampler of one checked arm: its call alone (the one its earlier looks at this point
        used), or a stack of ``item.layers`` calls."""
        if stacks is None:
            how = (mode, settings.l2, settings.timing)
            return built.sampler(
                how, lambda: make_sampler(built.call, self.device, mode, settings.l2, settings.timing)
            )
        static, shape = dict(item.static), dict(item.shape)
        calls = [built.call] + [task.prepare(static, shape, dict(arm), inputs) for inputs in stacks[1:]]
        return stack_sampler([calls[j % len(calls)] for j in range(item.layers)], self.device, mode)

    def _layer_inputs(self, task: TuningTask, item: WorkItem) -> list[Any]:
        """Input sets for a stack of ``item.layers`` layers: one per layer, as many as fit in memory
        (then layers reuse them in turn); the point's own inputs are the first."""
        static, shape = dict(item.static), dict(item.shape)
        per_set = max(1, task.bytes_moved(static, shape))
        if self.device.startswith("cuda"):
            import torch

            budget = torch.cuda.mem_get_info(self.device)[0] * _STACK_MEMORY_SHARE
        else:
            budget = _CPU_STACK_BYTES
        num_sets = max(1, min(item.layers, int(budget // per_set)))
        return [self._inputs] + [task.build_inputs(static, shape, self.device) for _ in range(num_sets - 1)]

    def prepare(
        self,
        task: TuningTask,
        item: WorkItem,
        static: dict[str, Any],
        shape: dict[str, Any],
        config: dict[str, Any],
        then: WorkItem | None = None,
    ) -> tuple[Callable[[], Any], float]:
        """The item's kernel call and the seconds preparing it took: the hook a runner that prepares
        items ahead overrides (``tunectl.orchestrator.pipeline``). Called once per config and point;
        ``then`` is the item prepared after this one (the next member of a batch, or the lookahead)."""
        return timed_prepare(task, static, shape, config, self._inputs)

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


def calls_per_sample(sampler: Sampler) -> int:
    """How many kernel calls one of ``sampler``'s samples times (``tunectl.measure.difference``)."""
    return int(getattr(sampler, "num_calls", 1))


def timed_prepare(
    task: TuningTask, static: dict[str, Any], shape: dict[str, Any], config: dict[str, Any], inputs: Any
) -> tuple[Callable[[], Any], float]:
    """``task.prepare`` and the seconds it took."""
    t0 = time.perf_counter()
    fn = task.prepare(static, shape, config, inputs)
    return fn, time.perf_counter() - t0


def _nothing(*_: Any) -> None:
    return None
