"""The ``tunectl`` command line: each command parses, calls one library function, reports."""

from __future__ import annotations

import logging
from typing import Any

import typer

from tunectl.cli import bundle, doctor, export, imports, probe, report, runs, submit, validate, workers

app = typer.Typer(
    help=(
        "Tune LLM-inference kernels on every GPU of a Ray cluster, and publish the winners as bundles.\n\n"
        "Example:\n\b\n"
        "    tunectl submit configs/quickstart.toml\n"
        "    tunectl export bundle --name quickstart --version 1 --out bundles"
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# Each command's help is its docstring, which ends with an Example: block; each group's help has one too.
app.command(name="submit")(submit.submit)
app.command(name="runs")(runs.list_runs_cmd)
app.command(name="winners")(runs.winners_cmd)
app.command(name="failures")(runs.failures_cmd)
app.command(name="doctor")(doctor.doctor_cmd)
app.command(name="logs")(runs.logs_cmd)
app.command(name="cancel")(runs.cancel_cmd)
app.command(name="report")(report.report_cmd)
app.command(name="validate")(validate.validate_cmd)
app.command(name="probe")(probe.probe_cmd)
app.add_typer(export.app, name="export")
app.add_typer(bundle.app, name="bundle")
app.add_typer(imports.app, name="import")
app.add_typer(workers.app, name="workers")


class _Warnings(logging.Handler):
    """Library warnings (a skipped file) as one ``warning:`` line each on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        typer.secho(f"warning: {record.getMessage()}", err=True, fg=typer.colors.YELLOW)


@app.callback()
def _setup() -> None:
    logger = logging.getLogger("tunectl")  # a run's own events have their handler (run_events)
    if not any(isinstance(h, _Warnings) for h in logger.handlers):
        logger.addHandler(_Warnings(logging.WARNING))


def _parser_error(name: str) -> Any:
    """One of the command-line parser's own error classes, from wherever this typer keeps its click."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


_USAGE_ERROR, _CLICK_ERROR = _parser_error("UsageError"), _parser_error("ClickException")


def main() -> None:
    """The console script: ``app``, with a mistyped command line said in one line (``error: ...``
    and where the command's help is), as the commands say every other bad input, not in a box."""
    try:
        code = app(standalone_mode=False)
    except _USAGE_ERROR as exc:  # an unknown option, a value of the wrong type, one missing
        if type(exc).__name__ == "NoArgsIsHelpError":  # a command group named alone: its help
            exc.show()
        else:
            ctx = getattr(exc, "ctx", None)
            where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            typer.echo(f"error: {' '.join(exc.format_message().split())}{where}", err=True)
        raise SystemExit(exc.exit_code) from None
    except _CLICK_ERROR as exc:
        exc.show()
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        raise SystemExit(1) from None
    if isinstance(code, int) and code:  # ``typer.Exit(code)``: its code
        raise SystemExit(code)
