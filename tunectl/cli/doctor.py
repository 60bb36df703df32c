"""Check a results dataset for files no reader can use, and move them aside."""

from __future__ import annotations

from typing import Annotated

import typer

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
    from tunectl.store.results import check_parts, require_dataset
    from tunectl.store.results import quarantine as move_aside
    from tunectl.store.runs import check_run_files

    with library_errors():
        root = require_dataset(results)
        bad = [(str(exc.path), str(exc)) for exc in check_parts(root)]
        bad += [(str(path), str(exc)) for path, exc in check_run_files(root)]
    if not bad:
        typer.echo(f"{results}: every file reads")
        return
    for _, why in bad:
        typer.echo(f"damaged: {why}")
    if not quarantine:
        typer.echo(f"{len(bad)} file(s) cannot be read; `tunectl doctor --results {results} --quarantine` "
                   "moves them aside")  # fmt: skip
        raise typer.Exit(1)
    with library_errors():
        moved = move_aside(root, [path for path, _ in bad])
    for source, target in moved:
        typer.echo(f"moved {source} -> {target}")
    typer.echo(f"{len(moved)} file(s) quarantined under {root / '_quarantine'}")
