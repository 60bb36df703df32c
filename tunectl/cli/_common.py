"""What every command shares: turning library errors into one line and an exit code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from tunectl.core.errors import TunectlError, UserError
from tunectl.store.runs import DEFAULT_RESULTS

ResultsOption = Annotated[
    Path, typer.Option("--results", help="The results dataset (a directory of Parquet files).")
]
__all__ = ["DEFAULT_RESULTS", "ResultsOption", "fail", "library_errors"]


def fail(message: str, code: int = 2) -> typer.Exit:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    return typer.Exit(code)


@contextlib.contextmanager
def library_errors() -> Iterator[None]:
    """User errors exit 2, other tunectl errors exit 1; both as one line, never a traceback."""
    try:
        yield
    except UserError as exc:
        raise fail(str(exc), 2) from None
    except TunectlError as exc:
        raise fail(str(exc), 1) from None
