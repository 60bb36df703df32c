"""Runs as library calls that take objects: ``run`` measures any work, ``submit`` a spec's search.

``run(work, resources, measure, results=..., info=...)`` places workers, dispatches the work's items
and streams records: every record is appended to the results dataset as it arrives (nothing is
held), and the run's metadata says how far it got, so a run stopped in any way is finished with
``submit(resume=RUN_ID)``: only the items without a record are measured again. A run is recorded
finished only once its work has every item's row (every arm of every comparison); a stop leaves it
resumable, on the newest metadata (the pools it placed). ``submit`` plans a spec and runs its
search; validation (``tunectl.api.checks``) builds its own work and calls ``run`` the same
way.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tunectl.core.errors import UserError
from tunectl.core.keys import Key
from tunectl.core.plan import Plan, WorkItem, check_size, plan
from tunectl.core.record import Record
from tunectl.core.registry import get_task
from tunectl.core.spec import MeasureSpec, ResourceSpec, Spec, load_spec, parse_spec
from tunectl.decide.work import tuning_work
from tunectl.orchestrator.cluster import Placement, Pool, choose_pools, connect
from tunectl.orchestrator.compile_schedule import BuildScheduler
from tunectl.orchestrator.compiling import note_builds, worker_setup
from tunectl.orchestrator.control import (
    CompileOptions,
    IncompleteRun,
    RunCancelled,
    RunStopped,
    cancel_requested,
    request_cancel,
)
from tunectl.orchestrator.dispatch import DispatchOptions, dispatch
from tunectl.orchestrator.feed import Lane, lookahead
from tunectl.orchestrator.lifecycle import RunFile, Workers, event_log, stops_recorded
from tunectl.orchestrator.notes import LOG_ONLY
from tunectl.store.results import ResultsWriter, done_item_ids, read_results
from tunectl.store.runs import RunInfo, load_run, new_run_id, refuse_if_running, run_exists

#: a run's stops, raised through ``run``
__all__ = ["IncompleteRun", "RunCancelled", "RunStopped", "request_cancel"]

log = logging.getLogger("tunectl.run")


@dataclass
class SubmitResult:
    run_id: str
    placement: Placement | None
    num_skipped_done: int  # records a resume found already there
    statuses: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    plan: Plan | None = None  # the spec's plan (a run of other work has none)
    #: each worker process's start-up, by the name its records carry (``DispatchStats.startups``)
    startups: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class RunOptions:
    """How a run reaches its cluster and paces itself; nothing here changes what it measures.

    ``compile_ahead``: prepare the next item in a background thread while timing the current one (with
    compile processes, only an item whose kernel is built). Off unless asked for: compiling beside a
    timed kernel skewed it (on the H200, single timed calls stretched up to 1000x); loading a built
    kernel ahead did not, and bought nothing measurable (``benchmarks/results/orchestration.md``).
    """

    address: str | None = None
    num_gpus: int | None = None
    num_cpus: int | None = None
    connect_fn: Callable[..., bool] = connect
    compile_ahead: bool | None = None
    stall_timeout_s: float = 900.0
    #: compile processes that build kernels ahead into shared on-disk caches (``orchestrator.compiling``)
    compile_options: CompileOptions | None = None


class Progress(Protocol):
    """What a caller hears while a run goes: the total once known, then each record."""

    def start(self, run_id: str, total: int, placement: Placement) -> None: ...

    def record(self, record: Record) -> None: ...

    def compiles(self, built: int, total: int, building: int) -> None: ...


class Work(Protocol):
    """What a pool runs (``tunectl.decide.search.Search``): told what a stopped run has, it hands out
    items as the pool's workers free up (``draw``), then more as records arrive (``follow_up``)."""

    def start(self, records: Iterable[Record] = ()) -> None: ...

    def draw(self, limit: int) -> list[WorkItem]: ...

    def follow_up(self, records: Sequence[Record]) -> list[WorkItem]: ...

    def estimate(self) -> int: ...

    def missing(self) -> int:
        """Items still without their records (zero once the work is done): a run is marked finished
        only then."""
        ...


WorkFor = Callable[[str | None], Work]  # a pool's work, given its name when the run has several


class _Silent:
    def start(self, run_id: str, total: int, placement: Placement) -> None:
        pass

    def record(self, record: Record) -> None:
        pass

    def compiles(self, built: int, total: int, building: int) -> None:
        pass


def _spec_for(
    spec: Spec | str | Path | None, resume: str | None, results: Path
) -> tuple[Spec, RunInfo | None]:
    if resume is None:
        if spec is None:
            raise UserError("give a SPEC file, or --resume RUN_ID")
        return (spec if isinstance(spec, Spec) else load_spec(spec)), None
    info = load_run(results, resume)
    if spec is not None and (spec if isinstance(spec, Spec) else load_spec(spec)).text != info.spec_text:
        given = spec.path if isinstance(spec, Spec) else spec
        raise UserError(
            f"run {resume} was started with another spec ({info.spec_path}); --resume finishes it with "
            f"its own: leave out {given}, or drop --resume to start a new run"
        )
    if info.kind != "tune":
        raise UserError(
            f"run {resume} is a {info.kind} run: `tunectl validate ... --resume {resume}` finishes it"
        )
    if info.state == "finished":
        raise UserError(f"run {resume} already finished; nothing to resume")
    refuse_if_running(info, results)
    return parse_spec(info.spec_text, info.spec_path, info.name), info


def new_run(
    spec: Spec, *, results: Path, num_planned: int, run_id: str | None = None, kind: str = "tune"
) -> RunInfo:
    """The metadata of a new run of ``spec`` (not yet saved); refuses an id ``results`` already has."""
    if results.exists() and not results.is_dir():
        raise UserError(f"--results {results} exists and is not a directory")
    if run_id is not None and run_exists(results, run_id):
        raise UserError(f"run {run_id} already exists in {results}; finish it with --resume {run_id}")
    now = time.time()
    return RunInfo(
        run_id or new_run_id(),
        spec.name,
        spec.task,
        spec.path,
        spec.text,
        "running",
        num_planned,
        now,
        now,
        kind=kind,
    )


def submit(
    spec: Spec | str | Path | None,
    results: str | Path = "tunectl-results",
    *,
    resume: str | None = None,
    progress: Progress | None = None,
    run_id: str | None = None,
    confirm_above: int | None = None,
    options: RunOptions = RunOptions(),
) -> SubmitResult:
    """Run (or resume) ``spec``'s search (a Spec, or a spec file's path); records land in ``results``.

    ``run_id``: the id for a new run (a job submitted for it chose it); default a fresh one.
    ``confirm_above``: refuse (``UserError``) a new run planning more items than this, before planning
    it (the caller asks the user to confirm); None: no limit.
    """
    results = Path(results)
    spec, previous = _spec_for(spec, resume, results)  # validate before touching anything
    if previous is None and confirm_above is not None:
        check_size(spec, confirm_above)
    task = get_task(spec.task)
    work = plan(spec, task)  # counted, not made: UserError, saying why, if it plans nothing
    info = previous or new_run(spec, results=results, num_planned=work.num_items, run_id=run_id)
    info = dataclasses.replace(info, facts=info.facts or work.facts)

    def search(pool: str | None) -> Work:
        def check(static: Key, shape: Key) -> str | None:
            return task.check_point(dict(static), dict(shape))

        return tuning_work(work, check, pool)

    out = run(
        search,
        spec.resources,
        spec.measure,
        results=results,
        info=info,
        resumed=previous is not None,
        progress=progress,
        options=options,
        strategy=spec.search.strategy,
        uses=work.all_configs,
    )
    out.plan = work
    return out


def run(
    work: WorkFor,
    resources: ResourceSpec,
    measure: MeasureSpec,
    *,
    results: str | Path,
    info: RunInfo,
    resumed: bool = False,
    progress: Progress | None = None,
    options: RunOptions = RunOptions(),
    strategy: str = "fixed",
    uses: Sequence[Key] = (),
) -> SubmitResult:
    """Measure ``work`` (each pool's, given its name when the run has several) as run ``info``.

    The run's metadata is saved as it goes; its records are appended to ``results`` as they arrive.
    ``resumed``: the run has records already; each pool's work starts from them. ``uses``: the configs
    the work measures (the workers import only their libraries up front; none given: all the task's).
    """
    results = Path(results)
    started = time.time()
    cancel_requested.clear()
    owns_ray = options.connect_fn(options.address, num_gpus=options.num_gpus, num_cpus=options.num_cpus)
    run_file = RunFile(results, info.with_driver())
    writer = ResultsWriter(results)
    job = _Job(work, resources, measure, strategy, resumed, tuple(uses))
    with Workers(run_file, owns_ray) as workers, stops_recorded(run_file, writer):
        run_file.save("running")
        with event_log(results, info.run_id):
            out = _measure(job, run_file, workers, writer, progress or _Silent(), options)
            writer.close()
        # Every item has its row (else _measure raised): planned, an estimate till now, is what was done.
        done = len(done_item_ids(results, info.run_id))
        run_file.save("finished", info=dataclasses.replace(run_file.info, num_planned=done))
    out.seconds = time.time() - started
    return out


@dataclass(frozen=True)
class _Job:
    """What a run measures, and how (``run``'s arguments)."""

    work: WorkFor
    resources: ResourceSpec
    measure: MeasureSpec
    strategy: str
    resumed: bool
    uses: tuple[Key, ...] = ()


@dataclass(frozen=True)
class _Started:
    """A run's workers at work: each pool's lane and work, the compile processes' scheduler."""

    info: RunInfo
    lanes: list[Lane]
    works: dict[str, Work]
    builds: BuildScheduler | None
    placement: Placement
    num_skipped_done: int


def _measure(
    job: _Job,
    run_file: RunFile,
    workers: Workers,
    writer: ResultsWriter,
    progress: Progress,
    options: RunOptions,
) -> SubmitResult:
    """Start the pools and compile processes, dispatch each pool's work until it is done, saying what
    is coming and what came, the run's metadata saved as it goes. ``IncompleteRun`` if dispatch ended
    with any item still without a row."""
    started = _start(job, run_file, workers, options, progress)
    info = started.info
    out = SubmitResult(info.run_id, started.placement, started.num_skipped_done)

    def on_records(records: list[Record]) -> None:
        writer.append_item(records)  # an item's records (a comparison's arms) reach disk together
        for record in records:
            out.statuses[record.status] += 1
            progress.record(record)

    progress.start(info.run_id, info.num_planned - out.num_skipped_done, started.placement)
    dispatch_options = DispatchOptions(
        prefetch=job.resources.prefetch,
        batch=job.resources.batch,
        compile_ahead=bool(options.compile_ahead),
        stall_timeout_s=options.stall_timeout_s,
    )
    stats = dispatch(started.lanes, info.run_id, job.measure, on_records, dispatch_options, started.builds)
    out.startups = stats.startups
    _finish(run_file, started)
    troubled = stats.num_worker_failures or stats.num_requeued  # else the console's summary says it all
    log.info(
        "run %s finished: %d record(s), %d worker failure(s), %d item(s) requeued",
        *(info.run_id, stats.num_records, stats.num_worker_failures, stats.num_requeued),
        extra=None if troubled else LOG_ONLY,
    )
    return out


def _start(
    job: _Job, run_file: RunFile, workers: Workers, options: RunOptions, progress: Progress
) -> _Started:
    """The pools placed, each one's work started (after what a resumed run has), compile processes
    where there are kernels to build ahead; the run's metadata saying so."""
    info, results = run_file.info, run_file.results
    names = list(info.pools) or choose_pools(job.resources.accelerator_type, job.resources.num_gpus)
    ahead = bool(options.compile_ahead)
    compile_options = options.compile_options or CompileOptions()
    setup = worker_setup(compile_options, info.task, ahead, job.uses, job.resources.cpu_threads)
    placement = workers.start_pools(names, job.resources.num_gpus, setup)
    pools = workers.pools
    works = {p.name: job.work(p.name if len(pools) > 1 else None) for p in pools}
    lanes, info, num_done = _lanes(pools, works, info, results, resumed=job.resumed)
    info, builds = workers.start_builds(  # progress hears of compiles only where there are builds
        lanes, info, compile_options, setup, lambda *counts: progress.compiles(*counts)
    )
    run_file.save("running", info=info)
    log.info(  # the console's progress says its own line
        "run %s: ~%d record(s) to come (%s search) from %d worker(s) in pool(s) %s (compile ahead: %s)",
        info.run_id,
        info.num_planned - num_done,
        job.strategy,
        placement.num_workers,
        ", ".join(info.pools),
        ahead,
        extra=LOG_ONLY,
    )
    return _Started(info, lanes, works, builds, placement, num_done)


def _finish(run_file: RunFile, started: _Started) -> None:
    """The run's size as its work now knows it (work that plans as it goes, refinement, knows it only
    now) and what was built, saved; ``IncompleteRun`` if an item is still without a row."""
    works = started.works.values()
    info = dataclasses.replace(
        started.info, num_planned=max(started.info.num_planned, sum(w.estimate() for w in works))
    )
    if started.builds is not None:
        note_builds(info, started.builds, run_file.results)
    run_file.save("running", info=info)
    missing = sum(w.missing() for w in works)
    if missing:
        raise IncompleteRun(info.run_id, info.kind, missing, run_file.results)


def _lanes(
    pools: list[Pool], works: dict[str, Work], info: RunInfo, results: Path, *, resumed: bool
) -> tuple[list[Lane], RunInfo, int]:
    """Each pool's lane, its first items drawn (after what a resumed run already has); the run's
    metadata to match."""
    records = read_results(results, run_ids=[info.run_id]) if resumed and results.is_dir() else []
    lanes = []
    for p in pools:
        work = works[p.name]
        work.start(records)
        lanes.append(Lane(p.name, tuple(p.workers), work, tuple(work.draw(lookahead(len(p.workers))))))
    planned = sum(w.estimate() for w in works.values())
    info = dataclasses.replace(info, pools=tuple(p.name for p in pools), num_planned=planned)
    return lanes, info, len(records)
