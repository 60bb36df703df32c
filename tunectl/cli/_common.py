"""What every command shares: turning library errors into one line and an exit code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from tunectl.api import DEFAULT_RESULTS
from tunectl.core.errors import OptionError, SpecError, TunectlError, UserError

ResultsOption = Annotated[
    Path, typer.Option("--results", help="The results dataset (a directory of Parquet files).")
]
__all__ = ["DEFAULT_RESULTS", "ResultsOption", "fail", "library_errors"]


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


@contextlib.contextmanager
def library_errors() -> Iterator[None]:
    """User errors exit 2, other tunectl errors exit 1; both as one line, never a traceback."""
    try:
        yield
    except SpecError as exc:
        raise fail(f"{exc.path}: {exc.field}: {exc.reason}", 2) from None
    except OptionError as exc:
        raise fail(f"{flag(exc.option)}: {exc.reason}", 2) from None
    except UserError as exc:
        raise fail(str(exc), 2) from None
    except TunectlError as exc:
        raise fail(str(exc), 1) from None
