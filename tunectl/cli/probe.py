"""``tunectl probe``: a tuning run's cells measured inside the regions they serve."""

from __future__ import annotations

from collections import Counter
from typing import Annotated

import typer
from rich.console import Console

from tunectl import api
from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, library_errors
from tunectl.cli.progress import measured
from tunectl.cli.validate import AddressOption, NumGpusOption

PerCellOption = Annotated[int, typer.Option(help="Shapes per cell, spread over the region it serves.")]
ShortlistOption = Annotated[
    int, typer.Option(help="Probed configs besides the default and the corners' winners: the cell's fastest.")
]
RoundsOption = Annotated[int, typer.Option(help="Interleaved rounds of each probe's configs.")]
ResumeOption = Annotated[
    str | None,
    typer.Option(help="Finish this stopped probe run (same RUN_ID, options).", metavar="PROBE_RUN"),
]


def probe_cmd(
    run: Annotated[str, typer.Argument(help="The tuning run whose cells to probe.", metavar="RUN_ID")],
    per_cell: PerCellOption = api.DEFAULT_PER_CELL,
    shortlist: ShortlistOption = api.DEFAULT_SHORTLIST,
    rounds: RoundsOption = api.DEFAULT_ROUNDS,
    results: ResultsOption = DEFAULT_RESULTS,
    address: AddressOption = None,
    num_gpus: NumGpusOption = None,
    resume: ResumeOption = None,
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
    console = Console()
    with library_errors():
        cluster = api.Cluster(address, num_gpus, cancel_on_sigterm=True)
        options = api.ProbeOptions(per_cell, shortlist, rounds, resume, cluster)
    done = measured(console, "probe", results, lambda bar: api.probe(results, run, options, bar))
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
