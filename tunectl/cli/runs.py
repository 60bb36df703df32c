"""Commands over runs: list them, show their winners."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tunectl import api
from tunectl.api.types import RunSummary, Winner
from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, library_errors
from tunectl.cli.quality import damaged_lines, print_quality
from tunectl.cli.render import compact, runs_table, winners_table
from tunectl.core.files import canonical_json

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (one array) instead of a table.")]


def list_runs_cmd(results: ResultsOption = DEFAULT_RESULTS, as_json: JsonOption = False) -> None:
    """List runs with their state and counts: planned, done, failed by status.

    Example:
    \b
        tunectl runs --results tunectl-results --json
    """
    with library_errors():
        runs = api.list_runs(results)
    if as_json:
        typer.echo(canonical_json([_run_json(r) for r in runs], indent=2))
        return
    rows = [_run_row(run) for run in runs]
    console = Console()
    console.print(runs_table(rows, f"runs in {results}", console.width))


def _run_row(run: RunSummary) -> tuple[str, ...]:
    """A run as the table shows it: id, name, task, state, started, planned, done, failed."""
    failed = ", ".join(f"{n} {s}" for s, n in run.failed.items()) or "0"
    started = time.strftime("%m-%d %H:%M", time.localtime(run.info.created_at))
    kind = "" if run.info.kind == "tune" else f" ({run.info.kind})"  # validate, holdout, probe
    info = run.info
    return (
        info.run_id,
        info.name + kind,
        info.task,
        run.state,
        started,
        str(info.num_planned),
        str(run.num_done),
        failed,
    )


def _run_json(run: RunSummary) -> dict[str, Any]:
    info = run.info
    shown = ("run_id", "name", "task", "kind", "created_at", "updated_at", "message", "num_planned")
    return {
        **{k: getattr(info, k) for k in shown},
        "state": run.state,
        "num_done": run.num_done,
        "counts": run.counts,
    }


AddressOption = Annotated[
    str | None,
    typer.Option(
        "--address",
        envvar="RAY_API_SERVER_ADDRESS",
        help="For a run submitted with --job: the cluster's dashboard, http://HEAD:8265.",
    ),
]
RunArg = Annotated[str, typer.Argument(help="A run id (`tunectl runs` lists them).", show_default=False)]


def logs_cmd(
    run: RunArg,
    results: ResultsOption = DEFAULT_RESULTS,
    address: AddressOption = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="With --address: keep printing until it ends.")
    ] = False,
) -> None:
    """Show a run's log: its job's output with --address, else its event log under --results.

    Example:
    \b
        tunectl logs r20261129-221300-3fa2c1 --address http://HEAD:8265 --follow
    """
    if address:
        with library_errors():
            if follow:
                status = api.follow_job(address, run, lambda text: typer.echo(text, nl=False))
                typer.echo(f"job of run {run}: {status}")
            else:
                typer.echo(api.job_logs(address, run), nl=False)
        return
    with library_errors():
        log = api.run_log(results, run)
    if log.text:
        typer.echo(log.text, nl=False)
    typer.echo(f"run {run}: {log.info.state}" + (f" ({log.info.message})" if log.info.message else ""))


def cancel_cmd(run: RunArg, results: ResultsOption = DEFAULT_RESULTS, address: AddressOption = None) -> None:
    """Stop a run: its job with --address, else its driver on this machine. Resume it later.

    Example:
    \b
        tunectl cancel r20261129-221300-3fa2c1
    """
    if address:
        with library_errors():
            status = api.cancel_job(address, run)
        resume = f"tunectl submit --job --resume {run} --address {address}"
        typer.echo(f"job of run {run}: {status}; finish it with `{resume}`")
        return
    with library_errors():
        typer.echo(api.cancel(results, run))


RunsOption = Annotated[list[str] | None, typer.Option(help="Only these runs (repeatable). Default: all.")]
TaskOption = Annotated[str | None, typer.Option(help="Only this task.")]


def winners_cmd(
    results: ResultsOption = DEFAULT_RESULTS,
    run: RunsOption = None,
    task: TaskOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the winner per point: config, median, the default's median, speedup. A ! column marks the
    points whose decision rests on flagged rows (drift, too few samples, noise over the target, rows
    lost to an unreadable file); the last line counts them.

    Example:
    \b
        tunectl winners --run r20261129-221300-3fa2c1 --task decode_attention
    """
    with library_errors():
        chosen = api.winners(results, api.Selection(run, task))
    dataset, winners, quality = chosen.dataset, chosen.winners, chosen.quality
    for line in damaged_lines(dataset, results):
        typer.secho(f"warning: {line}", err=True, fg=typer.colors.YELLOW)
    if as_json:
        typer.echo(canonical_json([_winner_json(w, quality.of(w.point)) for w in winners], indent=2))
        return
    console = Console()
    for name in sorted({w.task for w in winners}):
        console.print(winners_table([w for w in winners if w.task == name], f"winners: {name}", quality))
    if not winners:
        failed = sum(r.failed for r in dataset.records)
        console.print(
            f"no winners: none of {len(dataset.records)} measurement(s) finished with status ok"
            + (f"; `tunectl failures --results {results}` lists the {failed} that failed" if failed else "")
        )
    print_quality(console, quality, results)


def _winner_json(winner: Winner, flags: Iterable[str]) -> dict[str, Any]:
    out = {k: v for k, v in dataclasses.asdict(winner).items() if k not in ("static", "shape", "config")}
    out.update(static=dict(winner.static), shape=dict(winner.shape), config=dict(winner.config))
    return {**out, "reason": winner.reason, "flags": sorted(flags)}


def failures_cmd(
    results: ResultsOption = DEFAULT_RESULTS,
    run: RunsOption = None,
    task: TaskOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the measurements that failed (error, wrong_result, invalid, crash, timeout) with their
    messages.

    Example:
    \b
        tunectl failures --run r20261129-221300-3fa2c1 --json
    """
    with library_errors():
        records = api.records(results, api.Selection(run, task))
    failed = sorted((r for r in records if r.failed), key=lambda r: (r.run_id, r.finished_at))
    if as_json:
        row_of = (r.to_row() for r in failed)
        typer.echo(canonical_json([{k: row[k] for k in _FAILURE_FIELDS} for row in row_of], indent=2))
        return
    console = Console()
    if failed:  # an empty table says nothing the count below does not
        table = Table(title=f"failed measurements in {results}", title_justify="left")
        table.add_column("run", no_wrap=True, min_width=max(len(r.run_id) for r in failed))
        for col in ("status", "shape", "config", "message"):
            table.add_column(col, overflow="fold")
        for r in failed:
            message = r.message.strip().splitlines()[0][:300] if r.message.strip() else ""
            table.add_row(r.run_id, str(r.status), compact(r.shape), compact(r.config), message)
        console.print(table)
    console.print(f"{len(failed)} failed of {len(records)} measurement(s) in {results}")


#: what ``failures --json`` says of each failed measurement
_FAILURE_FIELDS = (
    "run_id",
    "task",
    "item_id",
    "phase",
    "status",
    "message",
    "static_key",
    "shape_key",
    "config_key",
)
