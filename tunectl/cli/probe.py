"""``tunectl probe``: a tuning run's cells measured inside the regions they serve."""

from __future__ import annotations

from collections import Counter
from typing import Annotated

import typer
from rich.console import Console

from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption
from tunectl.cli.submit import connect_trapping_cancel
from tunectl.cli.validate import AddressOption, NumGpusOption, measured
from tunectl.decide.probes import DEFAULT_PER_CELL, DEFAULT_SHORTLIST
from tunectl.decide.stacked import DEFAULT_ROUNDS


def probe_cmd(
    run: Annotated[str, typer.Argument(help="The tuning run whose cells to probe.", metavar="RUN_ID")],
    per_cell: Annotated[int, typer.Option(help="Shapes per cell, spread over the region it serves.")] = (
        DEFAULT_PER_CELL
    ),
    shortlist: Annotated[
        int,
        typer.Option(help="Probed configs besides the default and the corners' winners: the cell's fastest."),
    ] = DEFAULT_SHORTLIST,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds of each probe's configs.")] = DEFAULT_ROUNDS,
    results: ResultsOption = DEFAULT_RESULTS,
    address: AddressOption = None,
    num_gpus: NumGpusOption = None,
    resume: Annotated[
        str | None,
        typer.Option(help="Finish this stopped probe run (same RUN_ID, options).", metavar="PROBE_RUN"),
    ] = None,
) -> None:
    """Measure, in every cell of RUN_ID's grid, shapes spread over the region the cell serves (with
    ceil: the sizes above the tuned value below it, up to its own): the default against the cell's
    winner and fastest configs, in interleaved rounds. `tunectl export bundle` then serves each
    probed cell the config whose worst loss over its point and probes is least (the point's own
    winner where it is within the margin of that). Needs a spec that declares ranges.

    Example:
    \b
        tunectl probe r20261203-011616-338937 --per-cell 2 --shortlist 4
    """
    from tunectl.orchestrator.probe import probe

    console = Console()
    done = measured(console, "probe", results, lambda bar: probe(
        results, run, per_cell=per_cell, shortlist=shortlist, rounds=rounds, progress=bar, resume=resume,
        address=address, num_gpus=num_gpus, connect_fn=connect_trapping_cancel,
    ))  # fmt: skip
    plan = done.plan
    for why, n in sorted(Counter(s.why for s in plan.skipped).items()):
        console.print(f"not probed: {n} shape(s): {why}")
    if done.run_id is None:
        console.print(f"nothing to probe in run {run}")
        raise typer.Exit(1)
    console.print(
        f"probe run {done.run_id}: {len(plan.items)} shape(s) in {plan.cells} cell(s) of run {run}; "
        f"`tunectl export bundle` now chooses each probed cell's config over its region"
    )
