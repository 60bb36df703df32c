"""``tunectl submit`` as a library call: plan, place workers, dispatch, stream results."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from orchestrator.cluster import Placement, connect, start_workers
from orchestrator.dispatch import dispatch
from tunectl.errors import UserError
from tunectl.plan import Plan, plan
from tunectl.record import Record
from tunectl.results import ResultsWriter, done_item_ids
from tunectl.runs import RunInfo, load_run, new_run_id, save_run
from tunectl.spec import Spec, load_spec, parse_spec


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


class _Silent:
    def start(self, run_id: str, total: int, placement: Placement) -> None:
        pass

    def record(self, record: Record) -> None:
        pass


def _spec_for(spec_path: str | None, resume: str | None, results: Path) -> tuple[Spec, RunInfo | None]:
    if resume is None:
        if spec_path is None:
            raise UserError("give a SPEC file, or --resume RUN_ID")
        return load_spec(spec_path), None
    info = load_run(results, resume)
    if info.state == "finished":
        raise UserError(f"run {resume} already finished; nothing to resume")
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
) -> SubmitResult:
    """Run (or resume) a tuning run; every record lands in ``results`` as it arrives."""
    results = Path(results)
    progress = progress or _Silent()
    spec, previous = _spec_for(spec_path, resume, results)  # validate before touching anything
    work = plan(spec)
    if not work.items:
        raise UserError(f"{spec.path}: the spec plans no work (every point was skipped)")
    if results.exists() and not results.is_dir():
        raise UserError(f"--results {results} exists and is not a directory")
    run_id = previous.run_id if previous else new_run_id()
    done = done_item_ids(results, run_id) if previous else set()
    todo = [i for i in work.items if i.item_id not in done]
    started = time.time()
    info = previous or RunInfo(
        run_id, spec.name, spec.task, spec.path, spec.text, "running", len(work.items), started, started
    )
    owns_ray = connect_fn(address, num_gpus=num_gpus, num_cpus=num_cpus)
    save_run(results, info.with_state("running"))
    out = SubmitResult(run_id, work, None, len(done))
    writer = ResultsWriter(results)

    def on_record(record: Record) -> None:
        writer.append(record)
        out.statuses[record.status] += 1
        progress.record(record)

    try:
        workers, out.placement = start_workers(spec.resources.num_gpus, spec.resources.accelerator_type)
        progress.start(run_id, len(todo), out.placement)
        dispatch(workers, todo, run_id, spec.measure, on_record, spec.resources.prefetch)
    except BaseException as exc:
        writer.close()
        state = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        save_run(results, info.with_state(state, f"{type(exc).__name__}: {exc}"[:500]))
        raise
    finally:
        if owns_ray:
            import ray

            ray.shutdown()
    writer.close()
    save_run(results, info.with_state("finished"))
    out.seconds = time.time() - started
    return out
