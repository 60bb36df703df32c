"""What every command shares: turning library errors into one line and an exit code, the line worded
from the error's fields with the command line's own advice."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer

from tunectl.api import DEFAULT_RESULTS
from tunectl.api.errors import (
    BundleExistsError,
    DamagedResultsError,
    Fielded,
    IncompleteRun,
    NoResultsError,
    OptionError,
    OrchestrationError,
    TunectlError,
    UserError,
)

ResultsOption = Annotated[
    Path, typer.Option("--results", help="The results dataset (a directory of Parquet files).")
]
__all__ = [
    "DEFAULT_RESULTS",
    "Again",
    "ResultsOption",
    "error_line",
    "fail",
    "library_errors",
    "submit_again",
]


#: the options whose command-line flag is not their name with dashes
_FLAGS = {
    "num_shapes": "--holdout",
    "workers_per_node": "--compile-workers",
    "timeout_s": "--compile-timeout",
}


def flag(option: str) -> str:
    """The command-line flag of a library option (``per_cell``: ``--per-cell``)."""
    return _FLAGS.get(option, "--" + option.replace("_", "-"))


def fail(message: str, code: int = 2) -> typer.Exit:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    return typer.Exit(code)


#: what a command says to finish a run that stopped short, given the run's id ("finish it with ...")
Again = Callable[[str], str]


def submit_again(results: Path) -> Again:
    """A tuning run is finished by ``tunectl submit --resume``, in its results."""
    return lambda run_id: f"finish it with `tunectl submit --resume {run_id} --results {results}`"


@contextlib.contextmanager
def library_errors(again: Again | None = None) -> Iterator[None]:
    """User errors exit 2, other tunectl errors exit 1; both as one line, never a traceback.
    ``again``: how this command finishes a run that stopped short (the run errors' advice)."""
    try:
        yield
    except UserError as exc:
        raise fail(error_line(exc, again), 2) from None
    except TunectlError as exc:
        raise fail(error_line(exc, again), 1) from None


def error_line(exc: TunectlError, again: Again | None = None) -> str:
    """The one line for ``exc``: the problem from its fields, the advice the command line's own
    (its commands and flags) where it has some, else the library's."""
    if isinstance(exc, OptionError):
        return f"{flag(exc.option)}: {exc.reason}"
    if not isinstance(exc, Fielded):
        return str(exc)
    advice = _advice(exc, again)
    return str(exc) if advice is None else f"{exc.problem()}; {advice}"


def _advice(exc: Fielded, again: Again | None) -> str | None:
    """What the command line advises for ``exc``; None where the library's advice stands."""
    if isinstance(exc, NoResultsError):
        if exc.run is not None and exc.is_dir:
            return f"`tunectl runs --results {exc.results}` lists them"
        return "give --results DIR" if exc.task is None else None
    if isinstance(exc, DamagedResultsError):
        doctor = f"`tunectl doctor --results {exc.results}` lists such files"
        return f"{doctor}, --skip-damaged publishes without them"
    if isinstance(exc, BundleExistsError):
        return "versions are immutable: publish another --version"
    if isinstance(exc, IncompleteRun) and again is not None:
        return again(exc.run_id)
    if isinstance(exc, OrchestrationError) and again is not None:
        return f"{again(exc.run_id)} once the cluster is healthy"
    return None
