"""Runs as library calls that take objects: ``run`` measures any work, ``submit`` a spec's search.

``run(work, resources, measure, results=..., info=...)`` places workers, dispatches the work's items
and streams records: every record is appended to the results dataset as it arrives (nothing is
held), and the run's metadata says how far it got, so a run stopped in any way is finished with
``submit(resume=RUN_ID)``: only the items without a record are measured again. A run is recorded
finished only once its work has every item's row (every arm of every comparison); a stop leaves it
resumable, on the newest metadata (the pools it placed). ``submit`` plans a spec and runs its
search; validation (``tunectl.orchestrator.validate``) builds its own work and calls ``run`` the same
way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tunectl.core.errors import TunectlError, UserError
from tunectl.core.keys import Key
from tunectl.core.plan import Plan, WorkItem, check_size, plan
from tunectl.core.record import Record
from tunectl.core.registry import get_task
from tunectl.core.spec import MeasureSpec, ResourceSpec, Spec, load_spec, parse_spec
from tunectl.decide.work import tuning_work
from tunectl.orchestrator.builds import CompileOptions
from tunectl.orchestrator.cluster import (
    Placement,
    Pool,
    choose_pools,
    connect,
    start_pools,
    stop_builders,
    stop_pools,
)
from tunectl.orchestrator.compiling import note_builds, start_builds, worker_setup
from tunectl.orchestrator.dispatch import DispatchOptions, dispatch
from tunectl.orchestrator.feed import Lane, lookahead
from tunectl.orchestrator.notes import keep_notes
from tunectl.store.results import ResultsWriter, done_item_ids, read_results
from tunectl.store.runs import (
    RunInfo,
    load_run,
    new_run_id,
    refuse_if_running,
    run_exists,
    run_log_path,
    save_run,
)

log = logging.getLogger("tunectl.run")


class RunCancelled(KeyboardInterrupt):
    """The run was asked to stop (SIGTERM: ``tunectl cancel``, or a Ray job being stopped)."""


#: set once this process is asked to stop (``cancel``): the run is recorded cancelled even where the
#: exception that stopped it lost its type on the way (Ray turns one raised inside ``ray.wait`` into
#: a plain KeyboardInterrupt)
_cancel_requested = threading.Event()


def request_cancel() -> None:
    """Ask this process's run to stop as cancelled (a SIGTERM handler calls this): raises RunCancelled."""
    _cancel_requested.set()
    raise RunCancelled()


class RunStopped(KeyboardInterrupt):
    """A run stopped by Ctrl-C or a cancel once it existed: says which run, to resume it by id."""

    def __init__(self, run_id: str, state: str) -> None:
        self.run_id, self.state = run_id, state
        super().__init__(f"run {run_id} {state}")


class IncompleteRun(TunectlError):
    """Dispatch ended with items of the run's work still without a row: the run is not finished."""


@dataclass
class SubmitResult:
    run_id: str
    placement: Placement | None
    num_skipped_done: int  # records a resume found already there
    statuses: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    plan: Plan | None = None  # the spec's plan (a run of other work has none)


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
    #: compile processes that build kernels ahead into shared on-disk caches (``tunectl.orchestrator.builds``)
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
        run_id or new_run_id(), spec.name, spec.task, spec.path, spec.text, "running", num_planned, now, now,
        kind=kind,
    )  # fmt: skip


def submit(
    spec: Spec | str | Path | None,
    results: str | Path = "tunectl-results",
    *,
    resume: str | None = None,
    progress: Progress | None = None,
    run_id: str | None = None,
    confirm_above: int | None = None,
    **options: Any,
) -> SubmitResult:
    """Run (or resume) ``spec``'s search (a Spec, or a spec file's path); records land in ``results``.

    ``run_id``: the id for a new run (a job submitted for it chose it); default a fresh one.
    ``confirm_above``: refuse (``UserError``) a new run planning more items than this, before planning
    it (the caller asks the user to confirm); None: no limit.
    ``options``: ``RunOptions`` fields (address, num_gpus, num_cpus, connect_fn, compile_ahead, ...).
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
        search, spec.resources, spec.measure, results=results, info=info, resumed=previous is not None,
        progress=progress, options=RunOptions(**options), strategy=spec.search.strategy,
    )  # fmt: skip
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
) -> SubmitResult:
    """Measure ``work`` (each pool's, given its name when the run has several) as run ``info``.

    The run's metadata is saved as it goes; its records are appended to ``results`` as they arrive.
    ``resumed``: the run has records already; each pool's work starts from them.
    """
    results = Path(results)
    progress = progress or _Silent()
    started = time.time()
    _cancel_requested.clear()
    owns_ray = options.connect_fn(options.address, num_gpus=options.num_gpus, num_cpus=options.num_cpus)
    run_file = _RunFile(results, info.with_driver())
    out = SubmitResult(info.run_id, None, 0)
    writer = ResultsWriter(results)
    pools: list[Pool] = []
    builders: list[tuple[Any, str]] = []
    try:
        run_file.save("running")
        with _event_log(results, info.run_id):
            _measure(
                work, resources, measure, run_file=run_file, resumed=resumed, out=out, pools=pools,
                builders=builders, writer=writer, progress=progress, options=options, strategy=strategy,
            )  # fmt: skip
            writer.close()
        # Every item has its row (else _measure raised): planned, an estimate till now, is what was done.
        done = len(done_item_ids(results, info.run_id))
        run_file.save("finished", info=dataclasses.replace(run_file.info, num_planned=done))
    except BaseException as exc:
        _close_after_stop(writer)
        state = _stopped_state(exc)
        run_file.save(state, f"{type(exc).__name__}: {exc}"[:500])
        if isinstance(exc, KeyboardInterrupt):
            raise RunStopped(info.run_id, state) from None
        raise
    finally:
        try:
            _release(pools, builders, owns_ray, (results, info.run_id))
        except KeyboardInterrupt:  # a stop while the workers are let go: the run's state is recorded
            raise RunStopped(info.run_id, run_file.info.state) from None
    out.seconds = time.time() - started
    return out


class _RunFile:
    """The run's metadata as last saved: a stop records its state on the newest (the pools the run
    placed, its builds, its size), not on what the run began with."""

    def __init__(self, results: Path, info: RunInfo) -> None:
        self.results, self.info = results, info

    def save(self, state: str, message: str = "", info: RunInfo | None = None) -> None:
        self.info = (info or self.info).with_state(state, message)
        save_run(self.results, self.info)


def _close_after_stop(writer: ResultsWriter) -> None:
    """Write what the run has buffered; a write that fails now only leaves those items to a resume."""
    try:
        writer.close()
    except Exception as exc:
        log.warning("the last %d record(s) were not written (%s); a resume measures them again",
                    writer.buffered, exc)  # fmt: skip


def _measure(
    work: WorkFor,
    resources: ResourceSpec,
    measure: MeasureSpec,
    *,
    run_file: _RunFile,
    resumed: bool,
    out: SubmitResult,
    pools: list[Pool],
    builders: list[tuple[Any, str]],
    writer: ResultsWriter,
    progress: Progress,
    options: RunOptions,
    strategy: str,
) -> None:
    """Start the pools and compile processes (into ``pools`` and ``builders``, for the caller to stop),
    dispatch each pool's work until it is done, saying what is coming and what came, the run's
    metadata saved as it goes. ``IncompleteRun`` if dispatch ended with any item still without a row."""

    def on_records(records: list[Record]) -> None:
        writer.append_item(records)  # an item's records (a comparison's arms) reach disk together
        for record in records:
            out.statuses[record.status] += 1
            progress.record(record)

    info, results = run_file.info, run_file.results
    names = list(info.pools) or choose_pools(resources.accelerator_type, resources.num_gpus)
    ahead = bool(options.compile_ahead)
    compile_options = options.compile_options or CompileOptions()
    setup = worker_setup(compile_options, info.task, ahead)
    started, out.placement = start_pools(names, resources.num_gpus, setup, label=f"tunectl-{info.run_id}")
    pools += started
    works = {p.name: work(p.name if len(pools) > 1 else None) for p in pools}
    lanes, info, out.num_skipped_done = _lanes(pools, works, info, results, resumed=resumed)
    info, builds = start_builds(lanes, pools, builders, info=info, options=compile_options, setup=setup,
                                on_compiles=lambda *counts: progress.compiles(*counts))  # fmt: skip
    run_file.save("running", info=info)
    todo = info.num_planned - out.num_skipped_done
    log.info("run %s: ~%d record(s) to come (%s search) from %d worker(s) in pool(s) %s "
             "(compile ahead: %s)", info.run_id, todo, strategy, out.placement.num_workers,
             ", ".join(info.pools), ahead)  # fmt: skip
    progress.start(info.run_id, todo, out.placement)
    how = DispatchOptions(
        prefetch=resources.prefetch, compile_ahead=ahead, stall_timeout_s=options.stall_timeout_s
    )
    stats = dispatch(lanes, info.run_id, measure, on_records, how, builds=builds)
    # Work that plans more as it goes (refinement) knows its size only now.
    info = dataclasses.replace(
        info, num_planned=max(info.num_planned, sum(w.estimate() for w in works.values()))
    )
    if builds is not None:
        note_builds(info, builds)
    run_file.save("running", info=info)
    missing = sum(w.missing() for w in works.values())
    if missing:
        again = (
            f"finish it with `tunectl submit --resume {info.run_id} --results {results}`"
            if info.kind == "tune"
            else "run it again"
        )
        raise IncompleteRun(
            f"run {info.run_id} ended with {missing} item(s) still without a row, so it is not "
            f"marked finished; {again}"
        )
    log.info("run %s finished: %d record(s), %d worker failure(s), %d item(s) requeued",
             info.run_id, stats.num_records, stats.num_worker_failures, stats.num_requeued)  # fmt: skip


def _release(
    pools: list[Pool], builders: list[tuple[Any, str]], owns_ray: bool, run: tuple[Path, str]
) -> None:
    """Stop the compile processes and workers (what they noted on the side goes to the run's log), and Ray."""
    keep_notes([*(stop_builders(builders) or []), *(stop_pools(pools) or [])], *run)
    if owns_ray:
        import ray

        ray.shutdown()


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


def _stopped_state(exc: BaseException) -> str:
    if isinstance(exc, RunCancelled) or (isinstance(exc, KeyboardInterrupt) and _cancel_requested.is_set()):
        return "cancelled"
    return "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"


@contextlib.contextmanager
def _event_log(results: Path, run_id: str) -> Iterator[None]:
    """Append this run's events to ``_runs/<run>.log`` while it goes (``tunectl logs`` shows them)."""
    handler = logging.FileHandler(run_log_path(results, run_id), encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        handler.close()
