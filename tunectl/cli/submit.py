"""Plan SPEC's shape x config work, measure it on every worker of a Ray cluster, stream results."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tunectl import api
from tunectl.api.types import Record, Status, WorkerTime
from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, fail, library_errors, submit_again
from tunectl.cli.progress import RunBar, run_events, stopped_message
from tunectl.cli.quality import print_quality
from tunectl.cli.render import compact, winners_table

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
    with library_errors():
        compile = api.CompileOptions(compile_workers, compile_cache, compile_cache_shared, compile_timeout)
        cluster = api.Cluster(address, num_gpus, cancel_on_sigterm=True)
        confirm_above = None if yes else api.CONFIRM_ABOVE_ITEMS
        options = api.SubmitOptions(cluster, compile, compile_ahead, run_id, confirm_above)
        loaded = api.load_spec(spec) if spec else None
    if job:
        _submit_job(loaded, results, resume, options, follow)
    else:
        _submit_here(loaded, results, resume, options)


def _submit_here(
    spec: api.Spec | None, results: Path, resume: str | None, options: api.SubmitOptions
) -> None:
    console = Console()
    bar = RunBar(console)
    try:
        with library_errors(submit_again(results)), run_events(console):
            if resume is None:
                if spec is None:
                    raise fail("give a SPEC file, or --resume RUN_ID")
                out = api.submit(spec, results, options, bar)
            else:
                out = api.resume(resume, results, options, bar, spec=spec)
    except KeyboardInterrupt as exc:
        bar.stop()
        raise fail(stopped_message(exc, results), 130) from None
    finally:
        bar.stop()
    _print_summary(console, out, results)


def _print_summary(console: Console, out: Any, results: Path) -> None:
    """What the run did: its counts, the points it skipped, and its winners."""
    counts = ", ".join(f"{n} {s}" for s, n in sorted(out.statuses.items()))
    console.print(
        f"run [bold]{out.run_id}[/] finished in {out.seconds:.1f} s: {counts or 'nothing to do'}"
        + (f" ({out.num_skipped_done} already measured)" if out.num_skipped_done else "")
    )
    if out.statuses.get("dominated"):
        console.print(
            "dominated: first looks not taken, each config far behind at every point near "
            "(\\[search] skip_dominated); each row names the point and the ratio"
        )
    assert out.plan is not None  # a spec's run has its plan
    _print_skipped(console, out.plan.skipped_points)
    with library_errors():
        chosen = api.winners(results, api.Selection(run_ids=[out.run_id]))
    winners, quality, records = chosen.winners, chosen.quality, chosen.dataset.records
    console.print(winners_table(winners, f"winners of {out.run_id} ({out.plan.spec.task})", quality))
    probes = {r.shape_key for r in records if r.phase == "probe"}
    if probes:
        console.print(
            f"these are the tuned points' winners; {len(probes)} probe shape(s) were measured inside their "
            "regions, and `tunectl export bundle` chooses each probed cell's config over its region"
        )
    console.print(f"results: {results}")
    for line in _failure_lines(records, out.run_id, results):
        console.print(line, style="yellow", markup=False, highlight=False)
    print_quality(console, quality, results)
    _print_worker_times(console, api.worker_times(records, since=time.time() - out.seconds), out.startups)
    if not winners:
        failed = Counter(str(r.status) for r in records if not r.ok)
        counts = ", ".join(f"{n} {s}" for s, n in sorted(failed.items())) or "no measurement"
        raise fail(
            f"run {out.run_id} produced no usable result ({counts}); "
            f"`tunectl failures --run {out.run_id} --results {results}` lists why",
            1,
        )


def _print_worker_times(
    console: Console, times: list[WorkerTime], startups: dict[str, Any] | None = None, most: int = 4
) -> None:
    """Where the workers' time went in this submit (with each one's start-up, where ``startups`` has
    it): a line each, or the workers together and the least busy one where there are more than ``most``."""
    startups = startups or {}
    if len(times) > most:
        least = min(times, key=lambda t: t.busy)
        times = [WorkerTime.summed(times, f"{len(times)} workers together"), least]
    for t in times:
        console.print(t.line(startups.get(t.worker)), markup=False, highlight=False)


def _print_skipped(console: Console, skipped: Any, most: int = 5) -> None:
    """The points the task refused, a short line each (the static key only where it differs), at most
    ``most`` of them."""
    statics = {static for static, _, _ in skipped}
    for static, shape, why in skipped[:most]:
        where = " ".join(f"{k}={v}" for k, v in (*(static if len(statics) > 1 else ()), *shape))
        console.print(f"[yellow]skipped[/] {where}: {why}")
    if len(skipped) > most:
        console.print(f"[yellow]skipped[/] {len(skipped) - most} more point(s) the task cannot run")


def _print_dry_run(spec: Path, results: Path) -> None:
    """Items per static key and a time estimate, without touching Ray or the results."""
    with library_errors():
        planned = api.plan(api.load_spec(spec), results)
    console = Console()
    table = Table(title=f"{spec}: {planned.count.spec.task}", title_justify="left")
    for col, justify in (("static", "left"), ("points", "right"), ("items", "right")):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for static, points, items in planned.count.per_static:
        table.add_row(compact(static), f"{points:,}", f"{items:,}")
    console.print(table)
    skipped = planned.count.skipped_points
    more = ", ..." if len(skipped) > 1 else ""
    left_out = f"; {len(skipped):,} point(s) skipped ({skipped[0][2]}{more})" if skipped else ""
    console.print(
        f"{planned.count.num_items:,} item(s) to measure, "
        f"then {planned.num_comparisons:,} finals comparison(s){left_out}"
    )
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
    if planned.count.num_items > api.CONFIRM_ABOVE_ITEMS:
        console.print(f"more than {api.CONFIRM_ABOVE_ITEMS:,} items: running it needs --yes")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _submit_job(
    spec: api.Spec | None, results: Path, resume: str | None, options: api.SubmitOptions, follow: bool
) -> None:
    with library_errors():
        ref = api.submit_job(spec, str(results), options, resume=resume)
    typer.echo(f"run {ref.run_id} submitted as job {ref.submission_id} to {ref.address}")
    if not follow:
        typer.echo(
            f"follow it: tunectl logs {ref.run_id} --address {ref.address} --follow\n"
            f"stop it:   tunectl cancel {ref.run_id} --address {ref.address}"
        )
        return
    with library_errors():
        status = api.follow_job(ref.address, ref.run_id, lambda text: typer.echo(text, nl=False))
    typer.echo(f"job {ref.submission_id}: {status}")
    if status != "SUCCEEDED":
        raise typer.Exit(1)


#: how a measurement failed as it ran (a kernel that would not build, or that rejects its config, is
#: told by the compile processes' line and ``tunectl logs``)
FAILED_RUNNING = (Status.ERROR, Status.WRONG_RESULT, Status.CRASH, Status.TIMEOUT)


def _failure_lines(records: Iterable[Record], run_id: str, results: Path, most: int = 3) -> list[str]:
    """The measurements of ``run_id`` that failed as they ran, in a line, then their ``most`` commonest
    kinds (status and message; ties by status), each with how many and a config and shape it failed at."""
    kinds: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        if r.run_id == run_id and r.status in FAILED_RUNNING:
            kinds.setdefault((str(r.status), _head(r.message)), []).append(r)
    if not kinds:
        return []
    count = sum(len(rows) for rows in kinds.values())
    lines = [
        f"{count} measurement(s) failed as they ran; "
        f"`tunectl failures --run {run_id} --results {results}` lists each:"
    ]
    commonest = sorted(kinds.items(), key=lambda kind: (-len(kind[1]), kind[0]))
    for (status, head), rows in commonest[:most]:
        at = f"{compact(rows[0].config)} {compact(rows[0].shape)}"
        lines.append(f"  {len(rows)} {status}: {head} (at {at})")
    if len(commonest) > most:
        lines.append(f"  and {len(commonest) - most} other kind(s)")
    return lines


def _head(message: str, width: int = 100) -> str:
    """A message's first line, cut to ``width`` characters."""
    first = next((line.strip() for line in message.splitlines() if line.strip()), "(no message)")
    return first if len(first) <= width else first[: width - 1] + "…"
