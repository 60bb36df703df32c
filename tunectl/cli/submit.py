"""Plan SPEC's shape x config work, measure it on every worker of a Ray cluster, stream results."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, fail, library_errors
from tunectl.cli.quality import print_quality
from tunectl.cli.render import compact, winners_table
from tunectl.core.plan import CONFIRM_ABOVE_ITEMS


class RunBar:
    """Progress bar over the items of a run, counting failures as they come."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[failed]} failed"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.task_id: Any = None
        self.compile_id: Any = None
        self.failed = 0

    def start(self, run_id: str, total: int, placement: Any) -> None:
        self.console.print(
            f"run [bold]{run_id}[/]: ~{total} measurements on "
            f"{placement.num_workers} {placement.kind} worker(s) "
            f"across {placement.num_nodes} node(s)"
            + (
                f", once per accelerator type: {', '.join(placement.pools)}"
                if len(placement.pools) > 1
                else ""
            )
        )
        self.bar.start()
        self.task_id = self.bar.add_task("measuring", total=total, failed=0)

    def record(self, record: Any) -> None:
        self.failed += record.status != "ok"
        task = self.bar.tasks[self.task_id]
        total = max(task.total or 0, task.completed + 1)  # a search may measure more than estimated
        self.bar.update(self.task_id, advance=1, failed=self.failed, total=total)

    def compiles(self, built: int, total: int, building: int) -> None:
        """A second line while compile processes build kernels ahead: built of total, and how many now."""
        if self.task_id is None or not total:
            return
        if self.compile_id is None:
            self.compile_id = self.bar.add_task("compiling", total=total, failed=0)
        self.bar.update(
            self.compile_id, completed=built, total=total,
            description=f"compiling ({building} now)" if building else "compiling",
        )  # fmt: skip

    def stop(self) -> None:
        self.bar.stop()


class _ConsoleLog(logging.Handler):
    """The run's events on the console, above the progress bar (all of them when not a terminal)."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.INFO if not console.is_terminal else logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        style = "yellow" if record.levelno >= logging.WARNING else "dim"
        self.console.print(f"[{style}]{record.getMessage()}[/]", highlight=False, markup=True)


def _cancelled(signum: int, frame: Any) -> None:
    from tunectl.orchestrator.submit import request_cancel

    request_cancel()


def connect_trapping_cancel(*args: Any, **kwargs: Any) -> bool:
    """Join or start Ray, then take SIGTERM back (``ray.init`` installs a handler that just exits)."""
    from tunectl.orchestrator.cluster import connect

    owns_ray = connect(*args, **kwargs)
    signal.signal(signal.SIGTERM, _cancelled)
    return owns_ray


@contextlib.contextmanager
def run_events(console: Console) -> Iterator[None]:
    """Show the run's events on the console, and turn SIGTERM (a cancel) into a clean stop."""
    logger = logging.getLogger("tunectl.run")
    handler = _ConsoleLog(console)
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    previous = signal.signal(signal.SIGTERM, _cancelled)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        logger.removeHandler(handler)
        logger.propagate = propagate


SpecArg = Annotated[
    Path | None, typer.Argument(help="Tuning spec (TOML). Not needed with --resume.", show_default=False)
]
SubmitAddressOption = Annotated[
    str | None,
    typer.Option(
        help="Ray cluster to join (auto, HOST:6379, ray://HEAD:10001); with --job the dashboard, "
        "http://HEAD:8265. Default: a local instance."
    ),
]
ResumeOption = Annotated[
    str | None, typer.Option(help="Finish an interrupted run: measure only what it lacks.")
]
NumGpusOption = Annotated[
    int | None, typer.Option(help="Local instance only: GPUs to offer Ray (default: detected).")
]
JobOption = Annotated[
    bool,
    typer.Option(
        "--job",
        help="Submit through Ray's Job Submission API: the driver runs on the "
        "cluster (--address http://HEAD:8265; --results is a path on the cluster).",
    ),
]
FollowOption = Annotated[
    bool, typer.Option("--follow", help="With --job: print the job's log until it ends.")
]
CompileAheadOption = Annotated[
    bool | None,
    typer.Option(
        "--compile-ahead/--no-compile-ahead",
        help="Prepare the next config of the point while timing the current one (with compile "
        "processes: only one whose kernel is built, so it is loaded, never compiled). Default: off.",
    ),
]
CompileWorkersOption = Annotated[
    int | None,
    typer.Option(
        min=0,
        help="Compile processes per node, building kernels ahead into the on-disk caches so that "
        "GPU workers only load them; 0: workers compile for themselves. Default: from the node's "
        "spare cores on GPU nodes, none on GPU-less ones.",
    ),
]
CompileCacheOption = Annotated[
    str | None,
    typer.Option(
        help="Root of every kernel library's on-disk compile cache (Inductor, Triton, "
        "flash-attn-4). Default: tunectl-compile-cache in each node's temp dir, kept between runs."
    ),
]
CompileCacheSharedOption = Annotated[
    bool,
    typer.Option(
        "--compile-cache-shared",
        help="--compile-cache is on storage every node sees: build each kernel once per cluster.",
    ),
]
CompileTimeoutOption = Annotated[
    float, typer.Option(min=1.0, help="Seconds a kernel may take to build before it is a compile_timeout.")
]
RunIdOption = Annotated[str | None, typer.Option(hidden=True, help="The id of a new run (set by --job).")]
DryRunOption = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Count the items per static key and estimate the time from earlier runs; measure nothing.",
    ),
]
YesOption = Annotated[
    bool, typer.Option("--yes", help="Run a spec that plans more items than the size guard allows.")
]


def submit(
    spec: SpecArg = None,
    address: SubmitAddressOption = None,
    results: ResultsOption = DEFAULT_RESULTS,
    resume: ResumeOption = None,
    num_gpus: NumGpusOption = None,
    job: JobOption = False,
    follow: FollowOption = False,
    compile_ahead: CompileAheadOption = None,
    compile_workers: CompileWorkersOption = None,
    compile_cache: CompileCacheOption = None,
    compile_cache_shared: CompileCacheSharedOption = False,
    compile_timeout: CompileTimeoutOption = 600.0,
    run_id: RunIdOption = None,
    dry_run: DryRunOption = False,
    yes: YesOption = False,
) -> None:
    """Plan SPEC's shape x config work, measure it on a Ray cluster, stream results to Parquet.
    Exits 1 when the run produced no usable (ok) measurement.

    Example:
    \b
        tunectl submit configs/quickstart.toml --results tunectl-results
        tunectl submit configs/quickstart.toml --dry-run
        tunectl submit --resume r20261129-221300-3fa2c1
        tunectl submit configs/h200/flash_decode.toml --compile-cache /mnt/cache --compile-cache-shared
    """
    if dry_run:
        if spec is None:
            raise fail("--dry-run needs a SPEC file")
        _print_dry_run(spec, results)
        return
    compile_args = _compile_args(compile_workers, compile_cache, compile_cache_shared, compile_timeout)
    if job:
        if spec is not None and resume is None and not yes:
            _check_size_here(spec)  # here, not minutes later on the cluster
        extra = [*compile_args, *(["--yes"] if yes else [])]
        _submit_job(spec, address, results, resume, compile_ahead, follow, extra)
        return
    from tunectl.core.spec import load_spec
    from tunectl.orchestrator.compiling import CompileOptions
    from tunectl.orchestrator.submit import submit as run_submit

    console = Console()
    bar = RunBar(console)
    try:
        with library_errors(), run_events(console):
            out = run_submit(
                load_spec(spec) if spec else None, results, resume=resume, progress=bar, run_id=run_id,
                address=address, num_gpus=num_gpus, compile_ahead=compile_ahead,
                connect_fn=connect_trapping_cancel,
                compile_options=CompileOptions(
                    compile_workers, compile_cache, compile_cache_shared, compile_timeout
                ),
                confirm_above=None if yes else CONFIRM_ABOVE_ITEMS,
            )  # fmt: skip
    except KeyboardInterrupt as exc:
        bar.stop()
        raise fail(stopped_message(exc, results), 130) from None
    finally:
        bar.stop()
    _print_summary(console, out, results)


def _print_summary(console: Console, out: Any, results: Path) -> None:
    """What the run did: its counts, the points it skipped, and its winners."""
    from tunectl.formats.export import assessed_winners
    from tunectl.store.results import read_dataset

    counts = ", ".join(f"{n} {s}" for s, n in sorted(out.statuses.items()))
    console.print(
        f"run [bold]{out.run_id}[/] finished in {out.seconds:.1f} s: {counts or 'nothing to do'}"
        + (f" ({out.num_skipped_done} already measured)" if out.num_skipped_done else "")
    )
    assert out.plan is not None  # a spec's run has its plan
    for static, shape, why in out.plan.skipped_points:
        console.print(f"[yellow]skipped[/] {dict(static)} {dict(shape)}: {why}")
    with library_errors():
        dataset = read_dataset(results, run_ids=[out.run_id])
        winners, quality = assessed_winners(results, dataset)
    records = dataset.records
    console.print(winners_table(winners, f"winners of {out.run_id} ({out.plan.spec.task})", quality))
    probes = {r.shape_key for r in records if r.phase == "probe"}
    if probes:
        console.print(
            f"these are the tuned points' winners; {len(probes)} probe shape(s) were measured inside their "
            "regions, and `tunectl export bundle` chooses each probed cell's config over its region"
        )
    console.print(f"results: {results}")
    print_quality(console, quality, results)
    if not winners:
        failed = Counter(str(r.status) for r in records if not r.ok)
        counts = ", ".join(f"{n} {s}" for s, n in sorted(failed.items())) or "no measurement"
        raise fail(
            f"run {out.run_id} produced no usable result ({counts}); "
            f"`tunectl failures --run {out.run_id} --results {results}` lists why",
            1,
        )


def stopped_message(exc: KeyboardInterrupt, results: Path) -> str:
    """What a stop leaves, and how to go on: by the run's id once the run exists."""
    run_id = getattr(exc, "run_id", None)
    if run_id is None:
        return "stopped before the run started; nothing was written"
    if getattr(exc, "state", None) == "finished":
        return f"run {run_id} had finished, every item measured, when it was stopped; its results: {results}"
    return (
        f"run {run_id} stopped ({getattr(exc, 'state', 'interrupted')}); what was measured is kept. "
        f"Finish it with `tunectl submit --resume {run_id} --results {results}`"
    )


def _check_size_here(spec: Path) -> None:
    from tunectl.core.plan import check_size
    from tunectl.core.spec import load_spec

    with library_errors():
        check_size(load_spec(spec))


def _print_dry_run(spec: Path, results: Path) -> None:
    """Items per static key and a time estimate, without touching Ray or the results."""
    from tunectl.decide.estimate import dry_run

    with library_errors():
        planned = dry_run(spec, results)
    console = Console()
    table = Table(title=f"{spec}: {planned.count.spec.task}", title_justify="left")
    for col, justify in (("static", "left"), ("points", "right"), ("items", "right")):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for static, points, items in planned.count.per_static:
        table.add_row(compact(static), f"{points:,}", f"{items:,}")
    console.print(table)
    skipped = planned.count.skipped_points
    console.print(
        f"{planned.count.num_items:,} item(s) to measure, "
        f"then {planned.num_comparisons:,} finals comparison(s)"
        + (f"; {len(skipped):,} point(s) skipped ({skipped[0][2]}{', ...' if len(skipped) > 1 else ''})"
           if skipped else "")
    )  # fmt: skip
    spec_ = planned.count.spec
    budget = spec_.search.refine_budget
    if spec_.ranges() and budget > 0:
        extra = f"{budget:.0f}" if budget >= 1 else f"{budget:.0%} of the starting"
        short = spec_.search.refine_shortlist
        each = f", each measuring the default and its neighbours' {short} fastest" if short else ""
        console.print(f"then refinement: up to {extra} point(s) per static key where neighbours differ{each}")
    if planned.seconds is None:
        console.print(f"no earlier run of {planned.count.spec.task} in {results}: no time estimate")
    else:
        console.print(
            f"estimate: {_duration(planned.seconds)} of measurement on one worker (divide by the workers), "
            f"from {planned.num_earlier:,} earlier measurement(s) of {planned.count.spec.task} in {results}"
        )
    if planned.count.num_items > CONFIRM_ABOVE_ITEMS:
        console.print(f"more than {CONFIRM_ABOVE_ITEMS:,} items: running it needs --yes")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _compile_args(workers: int | None, cache: str | None, shared: bool, timeout_s: float) -> list[str]:
    """The compile options as command-line arguments (a job's driver gets them so)."""
    args = [] if workers is None else ["--compile-workers", str(workers)]
    args += [] if cache is None else ["--compile-cache", cache]
    args += ["--compile-cache-shared"] if shared else []
    return [*args, "--compile-timeout", f"{timeout_s:g}"]


def _submit_job(
    spec: Path | None,
    address: str | None,
    results: Path,
    resume: str | None,
    compile_ahead: bool | None,
    follow: bool,
    extra_args: list[str],
) -> None:
    from tunectl.orchestrator.jobs import follow_job_logs, submit_job

    with library_errors():
        ref = submit_job(
            address,
            str(spec) if spec else None,
            str(results),
            resume=resume,
            compile_ahead=compile_ahead,
            extra_args=extra_args,
        )
    typer.echo(f"run {ref.run_id} submitted as job {ref.submission_id} to {ref.address}")
    if not follow:
        typer.echo(
            f"follow it: tunectl logs {ref.run_id} --address {ref.address} --follow\n"
            f"stop it:   tunectl cancel {ref.run_id} --address {ref.address}"
        )
        return
    with library_errors():
        status = follow_job_logs(ref.address, ref.run_id, lambda text: typer.echo(text, nl=False))
    typer.echo(f"job {ref.submission_id}: {status}")
    if status != "SUCCEEDED":
        raise typer.Exit(1)
