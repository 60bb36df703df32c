"""Commands over runs: list them, show their winners."""

from __future__ import annotations

import time
from collections import Counter
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, library_errors
from tunectl.cli.render import winners_table


def list_runs_cmd(results: ResultsOption = DEFAULT_RESULTS) -> None:
    """List runs with their state and counts: planned, done, failed by status."""
    from tunectl.results import read_results
    from tunectl.runs import list_runs

    with library_errors():
        runs = list_runs(results)
        rows = read_results(results) if runs else []
    counts: dict[str, Counter[str]] = {}
    for row in rows:
        counts.setdefault(row["run_id"], Counter())[row["status"]] += 1
    table = Table(title=f"runs in {results}", title_justify="left")
    for col in ("run", "name", "task", "state", "started", "planned", "done", "failed"):
        table.add_column(col)
    for run in runs:
        c = counts.get(run.run_id, Counter())
        failed = ", ".join(f"{n} {s}" for s, n in sorted(c.items()) if s != "ok") or "0"
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.created_at))
        table.add_row(
            run.run_id,
            run.name,
            run.task,
            run.state,
            started,
            str(run.num_planned),
            str(sum(c.values())),
            failed,
        )
    Console().print(table)


def winners_cmd(
    results: ResultsOption = DEFAULT_RESULTS,
    run: Annotated[list[str] | None, typer.Option(help="Only these runs (repeatable). Default: all.")] = None,
    task: Annotated[str | None, typer.Option(help="Only this task.")] = None,
) -> None:
    """Show the winner per point: config, median, the default's median, speedup."""
    from tunectl.results import read_results
    from tunectl.select import select_winners

    with library_errors():
        winners = select_winners(read_results(results, run_ids=run, task=task))
    console = Console()
    for name in sorted({w.task for w in winners}):
        console.print(winners_table([w for w in winners if w.task == name], title=f"winners: {name}"))
    if not winners:
        console.print("no winners: no configuration finished with status ok")
