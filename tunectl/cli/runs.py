"""Commands over runs: list them, show their winners."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, library_errors
from tunectl.cli.render import winners_table


def list_runs_cmd(results: ResultsOption = DEFAULT_RESULTS) -> None:
    """List runs with their state and counts: planned, done, failed by status.

    Example:
    \b
        tunectl runs --results tunectl-results
    """
    from tunectl.runs import summarise_runs

    with library_errors():
        runs = summarise_runs(results)
    table = Table(title=f"runs in {results}", title_justify="left")
    for col in ("run", "name", "task", "state", "started", "planned", "done", "failed"):
        table.add_column(col)
    for run in runs:
        failed = ", ".join(f"{n} {s}" for s, n in run.failed.items()) or "0"
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.info.created_at))
        table.add_row(
            run.info.run_id,
            run.info.name,
            run.info.task,
            run.state,
            started,
            str(run.info.num_planned),
            str(run.num_done),
            failed,
        )
    Console().print(table)


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
    from tunectl.runs import load_run, run_log_path

    if address:
        from orchestrator.jobs import follow_job_logs, job_logs

        with library_errors():
            if follow:
                status = follow_job_logs(address, run, lambda text: typer.echo(text, nl=False))
                typer.echo(f"job of run {run}: {status}")
            else:
                typer.echo(job_logs(address, run), nl=False)
        return
    with library_errors():
        info = load_run(results, run)
    path = run_log_path(results, run)
    if path.is_file():
        typer.echo(path.read_text(encoding="utf-8"), nl=False)
    typer.echo(f"run {run}: {info.state}" + (f" ({info.message})" if info.message else ""))


def cancel_cmd(run: RunArg, results: ResultsOption = DEFAULT_RESULTS, address: AddressOption = None) -> None:
    """Stop a run: its job with --address, else its driver on this machine. Resume it later.

    Example:
    \b
        tunectl cancel r20261129-221300-3fa2c1
    """
    if address:
        from orchestrator.jobs import cancel_job

        with library_errors():
            status = cancel_job(address, run)
        typer.echo(f"job of run {run}: {status}; finish it with `tunectl submit --job --resume {run}`")
        return
    from tunectl.runs import cancel_local_run

    with library_errors():
        typer.echo(cancel_local_run(results, run))


def winners_cmd(
    results: ResultsOption = DEFAULT_RESULTS,
    run: Annotated[list[str] | None, typer.Option(help="Only these runs (repeatable). Default: all.")] = None,
    task: Annotated[str | None, typer.Option(help="Only this task.")] = None,
) -> None:
    """Show the winner per point: config, median, the default's median, speedup.

    Example:
    \b
        tunectl winners --run r20261129-221300-3fa2c1 --task decode_attention
    """
    from tunectl.export import winners_in

    with library_errors():
        winners = winners_in(results, run_ids=run, task=task)
    console = Console()
    for name in sorted({w.task for w in winners}):
        console.print(winners_table([w for w in winners if w.task == name], title=f"winners: {name}"))
    if not winners:
        console.print("no winners: no configuration finished with status ok")
