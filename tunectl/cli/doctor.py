"""Check a results dataset for files no reader can use, and move them aside."""

from __future__ import annotations

from typing import Annotated

import typer

from tunectl import api
from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, library_errors


def doctor_cmd(
    results: ResultsOption = DEFAULT_RESULTS,
    quarantine: Annotated[
        bool,
        typer.Option("--quarantine", help="Move each damaged file to DIR/_quarantine/ (nothing is deleted)."),
    ] = False,
) -> None:
    """List the files of a results dataset that cannot be read: damaged, empty or foreign Parquet
    parts, and unreadable run metadata. Readers skip them with a warning; --quarantine moves them
    out of the dataset. Exits 1 while such files remain.

    Example:
    \b
        tunectl doctor --results tunectl-results --quarantine
    """
    with library_errors():
        checkup = api.doctor(results, quarantine=quarantine)
    if not checkup.damaged:
        typer.echo(f"{results}: every file reads")
        return
    for _, why in checkup.damaged:
        typer.echo(f"damaged: {why}")
    if not quarantine:
        again = f"`tunectl doctor --results {results} --quarantine` moves them aside"
        typer.echo(f"{len(checkup.damaged)} file(s) cannot be read; {again}")
        raise typer.Exit(1)
    for source, target in checkup.moved:
        typer.echo(f"moved {source} -> {target}")
    typer.echo(f"{len(checkup.moved)} file(s) quarantined under {checkup.root / '_quarantine'}")
