"""The ``tunectl`` command line: each command parses, calls one library function, reports."""

from __future__ import annotations

import typer

from tunectl.cli import bundle, export, imports, report, runs, submit, validate

app = typer.Typer(
    help="Tune LLM-inference kernels on every GPU of a Ray cluster, and publish the winners as bundles.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# Each command's help is its docstring, which ends with an Example: block.
app.command(name="submit")(submit.submit)
app.command(name="runs")(runs.list_runs_cmd)
app.command(name="winners")(runs.winners_cmd)
app.command(name="logs")(runs.logs_cmd)
app.command(name="cancel")(runs.cancel_cmd)
app.command(name="report")(report.report_cmd)
app.command(name="validate")(validate.validate_cmd)
app.add_typer(export.app, name="export")
app.add_typer(bundle.app, name="bundle")
app.add_typer(imports.app, name="import")


def main() -> None:
    app()
