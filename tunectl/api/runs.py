"""Tuning runs: plan a spec, run it here or as a Ray job, resume it, cancel it, list runs, read a
run's log. Ray is imported only by the calls that measure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tunectl.api._running import run_options
from tunectl.api.options import SubmitOptions
from tunectl.core.spec import Spec
from tunectl.decide.estimate import DryRun
from tunectl.store.runs import RunInfo, RunSummary

if TYPE_CHECKING:
    from tunectl.orchestrator.jobs import JobRef
    from tunectl.orchestrator.submit import Progress, SubmitResult


def plan(spec: Spec, results: str | Path | None = None) -> DryRun:
    """``spec``'s work counted per static key (never made, so a huge grid costs little), and a time
    estimate from the earlier runs of its task in ``results``; nothing is measured."""
    from tunectl.decide.estimate import dry_run

    return dry_run(spec, results)


def check_size(spec: Spec) -> None:
    """``UserError`` if ``spec`` plans more items than a run takes without being confirmed."""
    from tunectl.core.plan import check_size as check

    check(spec)


def submit(
    spec: Spec, results: str | Path, options: SubmitOptions | None = None, progress: Progress | None = None
) -> SubmitResult:
    """Run ``spec``'s search on the cluster ``options.cluster`` names; every record lands in
    ``results`` as it arrives. A Ctrl-C or a cancel raises ``RunStopped``, naming the run to resume."""
    return _submit(spec, results, None, options or SubmitOptions(), progress)


def resume(
    run_id: str,
    results: str | Path,
    options: SubmitOptions | None = None,
    progress: Progress | None = None,
    *,
    spec: Spec | None = None,
) -> SubmitResult:
    """Finish the stopped run ``run_id``: only the items without a record are measured. ``spec``: the
    run's own spec again (refused if it is another one)."""
    return _submit(spec, results, run_id, options or SubmitOptions(), progress)


def _submit(
    spec: Spec | None,
    results: str | Path,
    resume: str | None,
    options: SubmitOptions,
    progress: Progress | None,
) -> SubmitResult:
    from tunectl.orchestrator.submit import submit as run_spec

    return run_spec(
        spec,
        results,
        resume=resume,
        progress=progress,
        run_id=options.run_id,
        confirm_above=options.confirm_above,
        options=run_options(options.cluster, compile_ahead=options.compile_ahead, compile=options.compile),
    )


def submit_job(
    spec: Spec | None, results: str, options: SubmitOptions | None = None, *, resume: str | None = None
) -> JobRef:
    """Submit the run (a new run of ``spec``, or the rest of run ``resume``) as a Ray job: its driver
    runs on the cluster at ``options.cluster.address`` (the dashboard, ``http://HEAD:8265``), and
    ``results`` is a path there."""
    from tunectl.orchestrator.jobs import submit_job as submit_to

    options = options or SubmitOptions()
    if spec is not None and resume is None and options.confirm_above is not None:
        check_size(spec)  # here, not minutes later on the cluster
    spec_path = spec.path if spec is not None else None
    return submit_to(
        options.cluster.address,
        spec_path,
        results,
        resume=resume,
        compile_ahead=options.compile_ahead,
        extra_args=_driver_args(options),
    )


def _driver_args(options: SubmitOptions) -> list[str]:
    """The options a job's driver is given, as ``tunectl submit`` arguments."""
    compile = options.compile
    args = [] if compile.workers_per_node is None else ["--compile-workers", str(compile.workers_per_node)]
    args += [] if compile.cache is None else ["--compile-cache", compile.cache]
    args += ["--compile-cache-shared"] if compile.shared else []
    args += ["--compile-timeout", f"{compile.timeout_s:g}"]
    return args + (["--yes"] if options.confirm_above is None else [])


def follow_job(address: str, run_id: str, write: Callable[[str], None]) -> str:
    """Write run ``run_id``'s job log as it grows until the job ends; the job's final status."""
    from tunectl.orchestrator.jobs import follow_job_logs

    return follow_job_logs(address, run_id, write)


def job_logs(address: str, run_id: str) -> str:
    """Run ``run_id``'s job log so far."""
    from tunectl.orchestrator.jobs import job_logs as logs

    return logs(address, run_id)


def cancel_job(address: str, run_id: str) -> str:
    """Stop run ``run_id``'s job (its driver records what it has and stops); the job's status."""
    from tunectl.orchestrator.jobs import cancel_job as cancel

    return cancel(address, run_id)


def cancel(results: str | Path, run_id: str) -> str:
    """Stop the driver of run ``run_id`` on this machine; what happened, in a sentence."""
    from tunectl.store.runs import cancel_local_run

    return cancel_local_run(results, run_id)


def list_runs(results: str | Path) -> list[RunSummary]:
    """Every run in ``results`` with its state and its record counts by status."""
    from tunectl.store.results import require_dataset
    from tunectl.store.runs import summarise_runs

    return summarise_runs(require_dataset(results))


@dataclass(frozen=True)
class RunLog:
    info: RunInfo
    text: str  # the run's event log ("" when it has none)


def run_log(results: str | Path, run_id: str) -> RunLog:
    """Run ``run_id``'s metadata and its event log under ``results``."""
    from tunectl.store.runs import load_run, run_log_path

    info = load_run(results, run_id)
    path = run_log_path(results, run_id)
    return RunLog(info, path.read_text(encoding="utf-8") if path.is_file() else "")
