"""Runs one work item in a worker: inputs, correctness check, measurement, record.

Inputs and the reference output are built once per (static, shape) point and kept while
consecutive items share that point. A config is prepared (compiled) and run once, its output
checked against the reference, and only then timed. Nothing here raises for a bad config: every
outcome becomes a ``Record`` with a status.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from tunectl.core.plan import WorkItem
from tunectl.core.record import Record, Status
from tunectl.core.spec import MeasureSpec
from tunectl.measure.build_memory import remembered
from tunectl.measure.built import FREE_SHARE_MIN, Built, Point, RecentPoints, with_warmup
from tunectl.measure.drift import MAX_WAIT_S, DriftGuard
from tunectl.measure.failures import clip, failure_message
from tunectl.measure.harness import Sampler, announced, calls_per_sample, interleave, measure, scaled
from tunectl.measure.memory import short_of_memory, when_memory_frees
from tunectl.measure.nvml import read_during, read_state, state_around
from tunectl.measure.outcome import CRASHED_ARM, NO_BASELINE, Check, Measured, Outcome, Timed, Verdict
from tunectl.measure.records import CallContext, measured, members_of
from tunectl.measure.reference import MakeReference, reference_sampler
from tunectl.measure.rounds import NotMeasurable, arm_stats, racing_for, round_times
from tunectl.measure.stacks import layer_inputs, stack_of, thrash_only
from tunectl.measure.timing import make_sampler, timing_of
from tunectl.tasks.base import InvalidConfig, TuningTask, compare_outputs
from tunectl.tasks.compile import release, synchronize
from tunectl.tasks.env import env_json, environment
from tunectl.tasks.registry import get_task

log = logging.getLogger("tunectl.worker")

#: a device state read this recently stands for the reading before the next measurement (seconds)
STATE_REUSE_S = 1.0


class CudaContextPoisoned(RuntimeError):
    """A kernel left the CUDA context unusable; the worker process must exit."""


class ItemRunner:
    """Evaluates work items on one device. One per worker process."""

    def __init__(self, device: str = "cpu", *, reference: MakeReference = reference_sampler) -> None:
        """``reference`` makes the drift guard's reference samplers for a device (``measure.reference``)."""
        self.device, self._guard_reference = device, reference
        self._guard: DriftGuard | None = None
        self._guard_failed = False
        self._tasks: dict[str, TuningTask] = {}
        self._point: tuple[Any, ...] | None = None
        self._here = Point()  # the current point's inputs, reference, checked configs and samplers
        self._points = RecentPoints(
            short_of_memory=functools.partial(short_of_memory, device, FREE_SHARE_MIN)
        )
        self._state: tuple[float, Any] = (-math.inf, None)  # (when, the device state read then)
        #: the item this worker gets after the current call, where the dispatcher says (its lookahead)
        self.next_item: WorkItem | None = None
        #: told which arm of a comparison is being checked (its index), and None once all are timed
        self.on_arm: Callable[[int | None], None] = lambda _: None
        #: told which member of a plain item or a batch is being checked or timed (its item id)
        self.on_member: Callable[[str], None] = lambda _: None

    @classmethod
    def for_process(cls, gpu_assigned: bool, num_threads: int) -> ItemRunner:
        """A runner on this process's GPU if it was given one torch can use, else on ``num_threads`` CPUs."""
        import torch

        device = "cuda:0" if gpu_assigned and torch.cuda.is_available() else "cpu"
        if device == "cpu":
            torch.set_num_threads(max(1, num_threads))
        return cls(device)

    def run(self, run_id: str, item: WorkItem, settings: MeasureSpec) -> list[Record]:
        """The item's records: one, one per member of a batch, or one per arm of a comparison
        (``item.arms``), in the order of ``members_of``."""
        task = self._task(item.task)
        mode = settings.mode if settings.mode != "auto" else task.serving_mode
        if not self.device.startswith("cuda"):
            mode = "eager"
        context = self._context(run_id, item, task, settings, mode)
        members = members_of(item)
        if item.arms:
            outcomes = self._guarded(lambda: self._compare(task, item, settings, mode), len(members))
        else:
            scaled_settings = scaled(settings, item.budget)
            outcomes = self._guarded(
                lambda: self._measure_each(task, item, scaled_settings, mode), len(members)
            )
        return [measured(context, m, o) for m, o in zip(members, outcomes, strict=True)]

    def _context(
        self, run_id: str, item: WorkItem, task: TuningTask, settings: MeasureSpec, mode: str
    ) -> CallContext:
        """What every record of ``item``'s call shares: the item's, and this worker's device's."""
        return CallContext.of(
            run_id,
            item,
            measure_mode=mode,
            timing=timing_of(self.device, settings.l2, settings.timing),
            l2=settings.l2,
            bytes_moved=task.bytes_moved(dict(item.static), dict(item.shape)) or None,
            device_name=str(environment(self.device).get("device_name", "")),
            device_kind=self.device.split(":")[0],
            host=socket.gethostname(),
            worker=f"{socket.gethostname()}:{os.getpid()}",
            env_json=env_json(self.device),
            started_at=time.time(),
        )

    def _guarded(self, evaluate: Callable[[], list[Outcome]], n: int) -> list[Outcome]:
        """``evaluate``'s outcomes; a config that fails is data (a status), never a failure of the run."""
        try:
            return evaluate()
        except Exception as exc:
            return [Outcome(failure=self._failed(exc))] * n

    def _failed(self, exc: Exception) -> Verdict:
        """How a config that raised ``exc`` ended (re-raised where the context is lost)."""
        if isinstance(exc, InvalidConfig):
            return Verdict(Status.INVALID, clip(str(exc)))
        if isinstance(exc, NotMeasurable):  # the numbers are fine, the method cannot resolve them: no trace
            return Verdict(Status.ERROR, str(exc))
        self._check_context()
        return Verdict(Status.ERROR, failure_message(exc))

    def _task(self, name: str) -> TuningTask:
        if name not in self._tasks:
            self._tasks[name] = get_task(name)
        return self._tasks[name]

    def _measure_each(
        self, task: TuningTask, item: WorkItem, settings: MeasureSpec, mode: str
    ) -> list[Outcome]:
        """Outcomes per member of a plain item or a batch: each checked, then each measured on its own,
        under one drift guard bracket (``DriftGuard.measure_many``)."""
        members = item.members or (item,)
        setup_ms = self._load_point(task, item) * 1e3
        static, shape = dict(item.static), dict(item.shape)
        outcomes: list[Outcome] = []
        timed: list[tuple[int, Sampler, MeasureSpec]] = []
        for i, m in enumerate(members):
            self.on_member(m.item_id)
            mine = len(outcomes)
            then = members[i + 1] if i + 1 < len(members) else self.next_item
            try:
                built, check = self._built(task, m.config, static, shape, dict(m.config), (m, then))
                outcomes.append(Outcome(check=check))
                if built is not None:
                    timed.append((len(outcomes) - 1, *self._sampler(built, settings, mode)))
            except Exception as exc:
                outcomes[mine:] = [Outcome(failure=self._failed(exc))]
        outcomes[0] = dataclasses.replace(outcomes[0], setup_ms=setup_ms)  # the point's set-up, paid once
        before = self._state_before()
        during = read_during(self.device)  # taken while the samples run (``tunectl.measure.nvml``)
        named = [
            (announced(s, functools.partial(self.on_member, members[i].item_id)), st) for i, s, st in timed
        ]
        found = self._measured(item, named)
        self._state = (time.perf_counter(), during.result())
        device = state_around(before, self._state[1])
        for (i, sampler, _), got in zip(timed, found, strict=True):
            outcome = dataclasses.replace(outcomes[i], device=device)
            calls = calls_per_sample(sampler)
            outcomes[i] = outcome.failed(got) if isinstance(got, Verdict) else outcome.measured(got, calls)
        return outcomes

    def _sampler(self, built: Built, settings: MeasureSpec, mode: str) -> tuple[Sampler, MeasureSpec]:
        """A checked config's sampler (built once at the point) and its settings with the warm-up it
        needs now."""
        how = (mode, settings.l2, settings.timing)
        sampler = self._sampler_of(built, settings, mode)
        return sampler, with_warmup(settings, built.warmup(how, settings, graph=self._graphs(mode)))

    def _sampler_of(self, built: Built, settings: MeasureSpec, mode: str) -> Sampler:
        """The sampler timing ``built``'s call as ``settings`` and ``mode`` say: built once at the point.
        A capture out of device memory makes room (``_room``) and tries again."""
        how = (mode, settings.l2, settings.timing)

        def make() -> Sampler:
            return make_sampler(built.call, self.device, mode, settings.l2, settings.timing)

        return built.sampler(how, lambda: when_memory_frees(make, self.device, self._room))

    def _room(self) -> bool:
        """Out of memory: let go of the points kept besides this one, else the samplers here (any went?)."""
        return self._points.clear(but=self._point) or self._here.let_samplers_go()

    def _measured(self, item: WorkItem, timed: list[tuple[Sampler, MeasureSpec]]) -> list[Measured | Verdict]:
        """Each sampler measured, with the drift guard's reading (under one bracket when guarded).
        Where the batch raises, each is measured alone, so a failure is charged to its config only."""
        guard = self._drift_guard(timed[0][1].drift) if timed else None
        try:
            if guard is None:
                return [(measure(s, st), None) for s, st in timed]
            return [(g.stats, g) for g in guard.measure_many((item.task, *item.point), timed)]
        except Exception:
            if len(timed) == 1:
                raise
        return [self._measured_alone(item, s, st) for s, st in timed]

    def _measured_alone(self, item: WorkItem, sampler: Sampler, settings: MeasureSpec) -> Measured | Verdict:
        try:
            [out] = self._measured(item, [(sampler, settings)])
            return out
        except Exception as exc:
            return self._failed(exc)

    def _built(
        self,
        task: TuningTask,
        config_key: Any,
        static: dict[str, Any],
        shape: dict[str, Any],
        config: dict[str, Any],
        items: tuple[WorkItem, WorkItem | None] | None = None,
    ) -> tuple[Built | None, Check]:
        """The config's checked call at the current point (built once, ``tunectl.measure.built``) and its
        check; (None, the failed check) where its output is wrong. ``items``: for ``prepare``."""
        built = self._here.get(config_key)
        if built is not None:
            return built, built.checked.again()
        inputs = self._here.inputs
        with remembered(task, static, shape, config, self.device):  # a kernel its compiler rejects
            if items is not None:
                fn, prepare_s = self.prepare(task, items[0], static, shape, config, inputs, items[1])
            else:
                fn, prepare_s = timed_prepare(task, static, shape, config, inputs)
            check = when_memory_frees(
                lambda: self._check(task, static, fn, prepare_s), self.device, self._room
            )
        if check.missed is not None:
            return None, check
        return self._here.keep(config_key, fn, check), check

    def _graphs(self, mode: str) -> bool:
        return mode == "graph" and self.device.startswith("cuda")

    def _state_before(self) -> Any:
        """The device's state before a measurement: the reading during the last one where that is recent."""
        taken, state = self._state
        if time.perf_counter() - taken <= STATE_REUSE_S:
            return state
        return read_state(self.device)

    def _drift_guard(self, action: str) -> DriftGuard | None:
        """The worker's drift guard acting as ``measure.drift`` asks (None for ``off``); its reference
        kernel is built on first use and kept for the worker's life."""
        if action == "off" or self._guard_failed:
            return None
        if self._guard is None:
            try:
                wait = MAX_WAIT_S if self.device.startswith("cuda") else 0.0
                self._guard = DriftGuard(self._guard_reference(self.device), action=action, max_wait_s=wait)
            except Exception as exc:  # no reference (memory, a missing op): measure unguarded, not fail
                self._guard_failed = True
                log.warning("drift guard off on %s: its reference could not be built (%s)", self.device, exc)
                return None
        self._guard.action = action
        return self._guard

    def _load_point(self, task: TuningTask, item: WorkItem) -> float:
        """Move to the item's point: its inputs and reference built, unless this worker keeps them
        (``tunectl.measure.built``); the seconds that took (0 where it stayed at the point)."""
        point = (item.task, item.static, item.shape)
        if point == self._point:
            return 0.0
        started = time.perf_counter()
        here = self._points.get(point)
        if here is None:
            self._point, self._here = None, Point()
            self._points.make_room()
            static, shape = dict(item.static), dict(item.shape)

            def build() -> tuple[Any, Any]:
                inputs = task.build_inputs(static, shape, self.device)
                reference = task.reference(static, shape, inputs)
                synchronize(self.device)
                return inputs, reference

            built = when_memory_frees(build, self.device, self._room)
            here = self._points.add(point, Point(*built))
        self._here, self._point = here, point
        return time.perf_counter() - started

    def _check(
        self, task: TuningTask, static: dict[str, Any], fn: Callable[[], Any], prepare_s: float
    ) -> Check:
        """Run ``fn`` once against the point's reference."""
        t0 = time.perf_counter()
        out = fn()
        synchronize(self.device)
        compile_ms = (prepare_s + time.perf_counter() - t0) * 1e3
        atol, rtol = task.tolerance(static)
        err, ok = compare_outputs(out, self._here.reference, atol, rtol)
        return Check(err, compile_ms, None if ok else (atol, rtol))

    def _compare(self, task: TuningTask, item: WorkItem, settings: MeasureSpec, mode: str) -> list[Outcome]:
        """Outcomes per arm of a comparison item: each arm checked, then all timed in interleaved rounds."""
        setup_s = self._load_point(task, item)
        stacks = (
            layer_inputs(task, item, self._here.inputs, self.device) if item.phase == "validate" else None
        )
        outcomes, samplers, warmups = self._checked_arms(task, item, settings, mode, stacks)
        outcomes = [dataclasses.replace(o, setup_ms=setup_s * 1e3) for o in outcomes]
        if 0 not in samplers:  # no baseline: the arms that passed their check are not compared
            return [o.failed(NO_BASELINE) if i in samplers else o for i, o in enumerate(outcomes)]
        started = time.perf_counter()
        timed = list(samplers.values())
        if stacks is not None:
            timed.append(thrash_only(item, self.device, mode))
            warmups = [settings.warmup] * len(timed)
        seed, race = int(item.item_id[:12], 16), racing_for(item.phase, stacked=stacks is not None)
        rounds = interleave(timed, item.rounds, settings, seed=seed, warmups=warmups, retire=race)
        times = round_times(rounds, item.layers if stacks is not None else 0)
        measure_ms = (time.perf_counter() - started) * 1e3
        for (i, sampler), t, r in zip(samplers.items(), times, rounds, strict=False):
            arm = arm_stats(times[0], t, r)
            timing = Timed(arm.stats, calls_per_sample(sampler), measure_ms)
            outcomes[i] = dataclasses.replace(outcomes[i], timed=timing, speedup=arm.speedup)
        return outcomes

    def _checked_arms(
        self, task: TuningTask, item: WorkItem, settings: MeasureSpec, mode: str, stacks: list[Any] | None
    ) -> tuple[list[Outcome], dict[int, Sampler], list[int]]:
        """Each arm's check; the samplers of the arms that passed, by index; their warm-ups. An
        arm that crashed a worker before, failed to build, is invalid here or fails is that arm's
        status; the others go on."""
        unbuilt = {arm: Verdict(Status(status), message) for arm, status, message in item.unbuilt_arms}
        outcomes: list[Outcome] = []
        samplers: dict[int, Sampler] = {}
        warmups: list[int] = []
        how = (mode, settings.l2, settings.timing)
        for i, arm in enumerate(item.arms):
            if i > 0 and (arm in item.crashed_arms or arm in unbuilt):
                outcomes.append(Outcome(failure=CRASHED_ARM if arm in item.crashed_arms else unbuilt[arm]))
                continue
            self.on_arm(i)
            try:
                built, check = self._built(task, arm, dict(item.static), dict(item.shape), dict(arm))
                outcomes.append(Outcome(check=check))
                if built is None:
                    continue
                if stacks is None:
                    samplers[i] = self._sampler_of(built, settings, mode)
                    warmups.append(built.warmup(how, settings, graph=self._graphs(mode)))
                else:
                    samplers[i] = stack_of(task, item, arm, built.call, stacks, self.device, mode)
                    warmups.append(0)
            except Exception as exc:
                outcomes[i:] = [Outcome(failure=self._failed(exc))]
        self.on_arm(None)
        return outcomes, samplers, warmups

    def prepare(
        self,
        task: TuningTask,
        item: WorkItem,
        static: dict[str, Any],
        shape: dict[str, Any],
        config: dict[str, Any],
        inputs: Any,
        then: WorkItem | None = None,
    ) -> tuple[Callable[[], Any], float]:
        """The item's kernel call on the point's ``inputs`` and the seconds it took to prepare: the hook a
        runner preparing ahead overrides (``tunectl.orchestrator.pipeline``); ``then``: the next item."""
        return timed_prepare(task, static, shape, config, inputs)

    def let_go(self) -> None:
        """Drop the points kept (inputs, samplers, built kernels' calls) and give their device memory
        back: a resident worker starts each run holding no more than a new one would."""
        self._point, self._here = None, Point()
        self._points.clear()
        release(self.device)

    def _check_context(self) -> None:
        """After a failure on CUDA, a sticky error (illegal address) makes every later call fail."""
        try:
            synchronize(self.device)
        except Exception as exc:
            raise CudaContextPoisoned(str(exc)) from exc


def timed_prepare(
    task: TuningTask, static: dict[str, Any], shape: dict[str, Any], config: dict[str, Any], inputs: Any
) -> tuple[Callable[[], Any], float]:
    """``task.prepare`` and the seconds it took."""
    t0 = time.perf_counter()
    fn = task.prepare(static, shape, config, inputs)
    return fn, time.perf_counter() - t0
