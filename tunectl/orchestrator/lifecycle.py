"""What a run leaves however it ends: its metadata saved as it goes, its workers let go, its stop
recorded and named (``RunStopped``: which run, to resume it by id), its events in its log."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tunectl.orchestrator import resident
from tunectl.orchestrator.cluster import (
    Placement,
    Pool,
    WorkerSetup,
    placement_of,
    start_pools,
    stop_builders,
    stop_pools,
)
from tunectl.orchestrator.compile_schedule import BuildScheduler
from tunectl.orchestrator.compiling import OnCompiles, start_builds
from tunectl.orchestrator.control import CompileOptions, RunCancelled, RunStopped, cancel_requested
from tunectl.orchestrator.feed import Lane
from tunectl.orchestrator.notes import keep_notes
from tunectl.store.results import ResultsWriter
from tunectl.store.runs import RunInfo, run_log_path, save_run

log = logging.getLogger("tunectl.run")


class RunFile:
    """The run's metadata as last saved: a stop records its state on the newest (the pools the run
    placed, its builds, its size), not on what the run began with."""

    def __init__(self, results: Path, info: RunInfo) -> None:
        self.results, self.info = results, info

    def save(self, state: str, message: str = "", info: RunInfo | None = None) -> None:
        self.info = (info or self.info).with_state(state, message)
        save_run(self.results, self.info)


class Workers:
    """A run's worker pools and compile processes, started inside ``with`` and let go on leaving it,
    however it is left (what they noted on the side goes to the run's log); Ray too, where the run
    started it. A stop while they are let go is a ``RunStopped`` in the state the run last saved."""

    def __init__(self, run_file: RunFile, owns_ray: bool) -> None:
        self.run_file, self.owns_ray = run_file, owns_ray
        self.pools: list[Pool] = []
        self.builders: list[tuple[Any, str]] = []

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        info = self.run_file.info
        try:
            notes = [*(stop_builders(self.builders) or []), *(stop_pools(self.pools) or [])]
            keep_notes(notes, self.run_file.results, info.run_id)
            if self.owns_ray:
                import ray

                ray.shutdown()
        except KeyboardInterrupt:  # a stop while the workers are let go: the run's state is recorded
            raise RunStopped(info.run_id, self.run_file.info.state) from None

    def start_pools(self, names: Sequence[str], num_gpus: int | None, setup: WorkerSetup) -> Placement:
        """The run's pools, one worker per GPU (or one on the CPU): where they were placed. On a
        cluster, the resident workers where it has any (``tunectl.orchestrator.resident``)."""
        run_id = self.run_file.info.run_id
        self.pools += resident.take(names, num_gpus, setup, run_id)  # none on a local instance of its own
        rest = [n for n in names if n not in {p.name for p in self.pools}]
        if rest:
            self.pools += start_pools(rest, num_gpus, setup, label=f"tunectl-{run_id}")[0]
        self.pools.sort(key=lambda p: list(names).index(p.name))
        return placement_of(self.pools)

    def start_builds(
        self,
        lanes: Sequence[Lane],
        info: RunInfo,
        options: CompileOptions,
        setup: WorkerSetup,
        on_compiles: OnCompiles,
    ) -> tuple[RunInfo, BuildScheduler | None]:
        """Compile processes where the lanes' first items have kernels to build ahead (``start_builds``)."""
        info, builders, builds = start_builds(
            lanes, self.pools, info=info, options=options, setup=setup, on_compiles=on_compiles
        )
        self.builders += builders
        return info, builds


@contextlib.contextmanager
def stops_recorded(run_file: RunFile, writer: ResultsWriter) -> Iterator[None]:
    """A run that stops on the way keeps what it measured and records how it stopped; a Ctrl-C or a
    cancel comes out as ``RunStopped``, which names the run to resume."""
    try:
        yield
    except BaseException as exc:
        close_after_stop(writer)
        state = stopped_state(exc)
        run_file.save(state, f"{type(exc).__name__}: {exc}"[:500])
        if isinstance(exc, KeyboardInterrupt):
            raise RunStopped(run_file.info.run_id, state) from None
        raise


def close_after_stop(writer: ResultsWriter) -> None:
    """Write what the run has buffered; a write that fails now only leaves those items to a resume."""
    try:
        writer.close()
    except Exception as exc:
        log.warning(
            "the last %d record(s) were not written (%s); a resume measures them again", writer.buffered, exc
        )


def stopped_state(exc: BaseException) -> str:
    if isinstance(exc, RunCancelled) or (isinstance(exc, KeyboardInterrupt) and cancel_requested.is_set()):
        return "cancelled"
    return "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"


@contextlib.contextmanager
def event_log(results: Path, run_id: str) -> Iterator[None]:
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
