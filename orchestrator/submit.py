"""``tunectl submit`` as a library call: plan, place workers, dispatch, stream results.

Every record is appended to the results dataset as it arrives (nothing is held), and the run's
metadata says how far it got, so a run stopped in any way is finished with ``resume=RUN_ID``:
only the items without a row are measured again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator.builds import SHARED, BuildBook, BuildScheduler, CompileOptions, KeyFn, key_function
from orchestrator.cluster import (
    CPU_POOL,
    Placement,
    Pool,
    WorkerSetup,
    choose_pools,
    connect,
    start_builders,
    start_pools,
    stop_builders,
    stop_pools,
)  # fmt: skip
from orchestrator.dispatch import DispatchOptions, Lane, dispatch
from tunectl.errors import UserError
from tunectl.plan import Plan, WorkItem, check_size, plan
from tunectl.record import RECORD_FIELDS, Record
from tunectl.results import ResultsWriter, read_results
from tunectl.runs import RunInfo, driver_alive, load_run, new_run_id, run_exists, run_log_path, save_run
from tunectl.search import Search
from tunectl.spec import Spec, load_spec, parse_spec

log = logging.getLogger("tunectl.run")


class RunCancelled(KeyboardInterrupt):
    """The run was asked to stop (SIGTERM: ``tunectl cancel``, or a Ray job being stopped)."""


class RunStopped(KeyboardInterrupt):
    """A run stopped by Ctrl-C or a cancel once it existed: says which run, to resume it by id."""

    def __init__(self, run_id: str, state: str) -> None:
        self.run_id, self.state = run_id, state
        super().__init__(f"run {run_id} {state}")


@dataclass
class SubmitResult:
    run_id: str
    plan: Plan
    placement: Placement | None
    num_skipped_done: int  # items a resume found already measured
    statuses: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0


class Progress(Protocol):
    """What a caller hears while a run goes: the total once known, then each record."""

    def start(self, run_id: str, total: int, placement: Placement) -> None: ...

    def record(self, record: Record) -> None: ...

    def compiles(self, built: int, total: int, building: int) -> None: ...


class Work(Protocol):
    """What a pool runs: its first items, then more as records arrive (``tunectl.search.Search``)."""

    def start(self, records: Iterable[Record] = ()) -> list[WorkItem]: ...

    def follow_up(self, records: Sequence[Record]) -> list[WorkItem]: ...

    def estimate(self) -> int: ...


WorkFor = Callable[[str | None], Work]  # a pool's work, given its name when the run has several


class _Silent:
    def start(self, run_id: str, total: int, placement: Placement) -> None:
        pass

    def record(self, record: Record) -> None:
        pass

    def compiles(self, built: int, total: int, building: int) -> None:
        pass


def _spec_for(spec_path: str | None, resume: str | None, results: Path) -> tuple[Spec, RunInfo | None]:
    if resume is None:
        if spec_path is None:
            raise UserError("give a SPEC file, or --resume RUN_ID")
        return load_spec(spec_path), None
    info = load_run(results, resume)
    if spec_path is not None and load_spec(spec_path).text != info.spec_text:
        raise UserError(
            f"run {resume} was started with another spec ({info.spec_path}); --resume finishes it with "
            f"its own: leave out {spec_path}, or drop --resume to start a new run"
        )
    if info.state == "finished":
        raise UserError(f"run {resume} already finished; nothing to resume")
    if info.state == "running" and driver_alive(info):
        raise UserError(
            f"run {resume} is still running (pid {info.driver_pid}); stop it first: `tunectl cancel {resume}`"
        )
    return parse_spec(info.spec_text, info.spec_path, info.name), info


def submit(
    spec_path: str | None,
    results: str | Path = "tunectl-results",
    address: str | None = None,
    resume: str | None = None,
    progress: Progress | None = None,
    num_gpus: int | None = None,
    num_cpus: int | None = None,
    connect_fn: Callable[..., bool] = connect,
    run_id: str | None = None,
    compile_ahead: bool | None = None,
    stall_timeout_s: float = 900.0,
    work_for: WorkFor | None = None,
    kind: str = "tune",
    compile_options: CompileOptions | None = None,
    confirm_above: int | None = None,
) -> SubmitResult:
    """Run (or resume) a tuning run; every record lands in ``results`` as it arrives.

    ``compile_ahead``: prepare the next item in a background thread while timing the current one. Off
    unless asked for: a preparation that launches device work or holds the interpreter lock while
    a kernel is timed skews that time (seen on the H200: single timed calls stretched up to 1000x).
    ``run_id``: the id for a new run (a job submitted for it chose it); default a fresh one.
    ``work_for``: what each pool runs (default: the spec's search over its plan); ``kind`` names it
    in the run's metadata (a validation run is ``validate``). ``compile_options``: compile processes that
    build kernels ahead into shared on-disk caches (``orchestrator.builds``).
    ``confirm_above``: refuse (``UserError``) a new run planning more items than this, before planning
    it (the caller asks the user to confirm); None: no limit.
    """
    results = Path(results)
    progress = progress or _Silent()
    compile_options = compile_options or CompileOptions()
    spec, previous = _spec_for(spec_path, resume, results)  # validate before touching anything
    if previous is not None and previous.kind != kind:
        raise UserError(f"run {resume} is a {previous.kind} run; run it again instead of resuming it")
    if previous is None and confirm_above is not None:
        check_size(spec, confirm_above)
    work = plan(spec)

    def search(pool: str | None) -> Work:
        return Search(work, spec.search, pool)

    if results.exists() and not results.is_dir():
        raise UserError(f"--results {results} exists and is not a directory")
    if previous is None and run_id is not None and run_exists(results, run_id):
        raise UserError(f"run {run_id} already exists in {results}; finish it with --resume {run_id}")
    run_id = previous.run_id if previous else (run_id or new_run_id())
    started = time.time()
    info = previous or RunInfo(
        run_id, spec.name, spec.task, spec.path, spec.text, "running", len(work.items), started, started,
        kind=kind,
    )  # fmt: skip
    info = info.with_driver()
    owns_ray = connect_fn(address, num_gpus=num_gpus, num_cpus=num_cpus)
    save_run(results, info.with_state("running"))
    out = SubmitResult(run_id, work, None, 0)
    writer = ResultsWriter(results)
    pools: list[Pool] = []
    builders: list[tuple[Any, str]] = []

    def on_records(records: list[Record]) -> None:
        writer.append_item(records)  # an item's records (a comparison's arms) reach disk together
        for record in records:
            out.statuses[record.status] += 1
            progress.record(record)

    try:
        with _event_log(results, run_id):
            names = list(previous.pools) if previous and previous.pools else choose_pools(
                spec.resources.accelerator_type, spec.resources.num_gpus
            )  # fmt: skip
            ahead = bool(compile_ahead)
            setup = _setup(compile_options, spec.task, ahead)
            pools, out.placement = start_pools(
                names, spec.resources.num_gpus, setup, label=f"tunectl-{run_id}"
            )
            work_of = work_for or search
            searches = {p.name: work_of(p.name if len(pools) > 1 else None) for p in pools}
            lanes, info, out.num_skipped_done = _lanes(
                pools, searches, info, results, resumed=previous is not None
            )
            key_fn = key_function()
            if any(key_fn(item) for lane in lanes for item in lane.items):
                builders = _builders(pools, compile_options, setup)
            info = dataclasses.replace(info, compile=_compile_meta(compile_options, setup, builders))
            save_run(results, info.with_state("running"))
            builds = _scheduler(compile_options, builders, progress, key_fn)
            todo = info.num_planned - out.num_skipped_done
            log.info("run %s: ~%d record(s) to come (%s search) from %d worker(s) in pool(s) %s "
                     "(compile ahead: %s)", run_id, todo, spec.search.strategy, out.placement.num_workers,
                     ", ".join(names), ahead)  # fmt: skip
            progress.start(run_id, todo, out.placement)
            options = DispatchOptions(spec.resources.prefetch, ahead, stall_timeout_s=stall_timeout_s)
            stats = dispatch(
                lanes, run_id, spec.measure, on_records, options,
                follow_up=lambda lane, records: searches[lane].follow_up(records), builds=builds,
            )  # fmt: skip
            if builds is not None:
                built, total, _ = builds.book.counts()
                info.compile.update(built=built, keys=total, build_seconds=round(builds.book.seconds, 3),
                                    per_kernel_seconds=builds.book.build_seconds)  # fmt: skip
                log.info("run %s: compile processes built %d of %d kernel(s) in %.1f s of compile time",
                         run_id, built, total, builds.book.seconds)  # fmt: skip
            writer.close()
            log.info("run %s finished: %d record(s), %d worker failure(s), %d item(s) requeued",
                     run_id, stats.num_records, stats.num_worker_failures, stats.num_requeued)  # fmt: skip
    except BaseException as exc:
        writer.close()
        state = _stopped_state(exc)
        save_run(results, info.with_state(state, f"{type(exc).__name__}: {exc}"[:500]))
        if isinstance(exc, KeyboardInterrupt):
            raise RunStopped(run_id, state) from None
        raise
    finally:
        stop_builders(builders)
        stop_pools(pools)
        if owns_ray:
            import ray

            ray.shutdown()
    save_run(results, info.with_state("finished"))
    out.seconds = time.time() - started
    return out


def _lanes(
    pools: list[Pool], searches: dict[str, Work], info: RunInfo, results: Path, resumed: bool
) -> tuple[list[Lane], RunInfo, int]:
    """Each pool's first items (after what a resumed run already has); the run's metadata to match."""
    rows = read_results(results, run_ids=[info.run_id]) if resumed and results.is_dir() else []
    records = [Record(**{name: row[name] for name in RECORD_FIELDS}) for row in rows]
    lanes = [Lane(p.name, tuple(p.workers), tuple(searches[p.name].start(records))) for p in pools]
    planned = sum(s.estimate() for s in searches.values())
    info = dataclasses.replace(info, pools=tuple(p.name for p in pools), num_planned=planned)
    return lanes, info, len(rows)


def _setup(compile: CompileOptions, task: str, compile_ahead: bool) -> WorkerSetup:
    from tasks.compile import cache_env

    env = tuple(sorted(cache_env(compile.cache_root()).items()))
    return WorkerSetup(env=env, warm_up=(task,), compile_ahead=compile_ahead)


def _builders(pools: list[Pool], compile: CompileOptions, setup: WorkerSetup) -> list[tuple[Any, str]]:
    """Compile processes on the nodes of the run's pools: on GPU nodes unless told otherwise; on
    GPU-less nodes only when asked for (they would take cores from the measurement)."""
    if compile.workers_per_node == 0:
        return []
    if compile.workers_per_node is None and all(p.name == CPU_POOL for p in pools):
        return []
    nodes = sorted(set().union(*(p.node_ids for p in pools)))
    return start_builders(nodes, compile.workers_per_node, setup)


def _scheduler(compile: CompileOptions, builders: list[tuple[Any, str]], progress: Progress,
               key_fn: KeyFn) -> BuildScheduler | None:  # fmt: skip
    if not builders:
        return None
    scopes = [SHARED] if compile.shared else sorted({node for _, node in builders})
    book = BuildBook(key_fn, scopes)
    return BuildScheduler(
        book, builders, compile.timeout_s, on_change=lambda b: progress.compiles(*b.counts())
    )


def _compile_meta(
    compile: CompileOptions, setup: WorkerSetup, builders: list[tuple[Any, str]]
) -> dict[str, Any]:
    return {
        "cache": compile.cache_root(), "shared": compile.shared, "timeout_s": compile.timeout_s,
        "compile_processes": len(builders), "env": dict(setup.env),
    }  # fmt: skip


def _stopped_state(exc: BaseException) -> str:
    if isinstance(exc, RunCancelled):
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
