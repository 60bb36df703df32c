"""The report command: an HTML page of what tuning found, with its plots beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tunectl import api
from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, library_errors


def report_cmd(
    results: ResultsOption = DEFAULT_RESULTS,
    bundle: Annotated[
        str | None,
        typer.Option(help="Also show this bundle: directory, archive, URI, or STORE/NAME@CHANNEL."),
    ] = None,
    run: Annotated[list[str] | None, typer.Option(help="Only these runs (repeatable). Default: all.")] = None,
    out: Annotated[
        Path, typer.Option("--out", help="Directory for index.html and its PNG plots (created if missing).")
    ] = Path("tunectl-report"),
) -> None:
    """Write an HTML report: speedup per shape, noise per measurement, validation verdicts, imported
    autotuning logs, a bundle's entries.

    Example:
    \b
        tunectl report --results tunectl-results --bundle bundles/quickstart/1 --out report
    """
    with library_errors():
        res = api.report(results, out, bundle=bundle, run_ids=run)
    typer.echo(
        f"wrote {res.index} with {len(res.plots)} plot(s): {res.num_rows} measurements, "
        f"{res.num_winners} winners"
    )
