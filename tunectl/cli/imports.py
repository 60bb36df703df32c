"""Import other tuners' measurements into the results dataset, to compare, select and export them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tunectl import api
from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, library_errors
from tunectl.cli.export import report_files

app = typer.Typer(
    help=(
        "Import other tuners' measurements as rows of an import run.\n\n"
        "Example:\n\b\n"
        "    tunectl import flex-log autotune.log --results tunectl-results"
    ),
    no_args_is_help=True,
)


@app.command("flex-log")
def flex_log_cmd(
    file: Annotated[
        Path,
        typer.Argument(
            help="The log TORCHINDUCTOR_FLEX_ATTENTION_LOGGING_FILE made (Inductor adds .json).",
            show_default=False,
        ),
    ],
    results: ResultsOption = DEFAULT_RESULTS,
    run: Annotated[
        str | None, typer.Option(help="Add to this import run (a file imported again replaces its rows).")
    ] = None,
    options_out: Annotated[
        Path | None, typer.Option("--options-out", help="Also write each shape's winners as kernel_options.")
    ] = None,
) -> None:
    """Import every choice Inductor timed in a FlexAttention autotuning log (task inductor_flex).

    Example:
    \b
        tunectl import flex-log autotune.log --results tunectl-results --options-out flex-options
    """
    with library_errors():
        res = api.import_flex_log(file, results, run_id=run, options_out=options_out)
    typer.echo(
        f"imported {res.num_choices} choices of {res.num_entries} entries from {file} into run {res.run_id}: "
        f"{res.rows_written} rows ({res.num_failed} failed, {res.num_replaced} replaced by a later entry)"
    )
    if res.options is not None:
        report_files("kernel_options", res.options)
    typer.echo(f"winners: tunectl winners --results {results} --run {res.run_id}")
