"""Typed errors. Each says what went wrong and, where it can, what to do next.

An error of a kind the caller may act on carries its facts as fields (``Fielded``): a ``SpecError``
its ``path``, ``field`` and ``reason``, a ``NoResultsError`` the ``results`` directory and the
``run`` or ``task`` asked for. ``str(error)`` words them, ``problem()`` and ``advice()`` apart, so a
caller can word its own advice from the same fields; the command line does.

The CLI turns ``UserError`` into one line on stderr and exit code 2; any other ``TunectlError``
into one line and exit code 1. Standard library only.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path


class TunectlError(Exception):
    """Base of every error tunectl raises on purpose."""


class UserError(TunectlError):
    """Bad input from the user: a spec, an argument, a path."""


@dataclasses.dataclass(eq=False)
class Fielded(TunectlError):
    """An error whose facts are the fields of its dataclass. ``problem()`` words what went wrong,
    ``advice()`` what to do next ("" if nothing), and ``str()`` both. ``args`` holds the fields in
    order, so the error pickles (and crosses processes) whole.

    An error class decorated ``@dataclasses.dataclass(eq=False)`` names it first among its bases:
    ``class NoResultsError(Fielded, ResultsError, UserError)``."""

    def __post_init__(self) -> None:
        self.args = tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def problem(self) -> str:
        """What went wrong, worded from the fields."""
        raise NotImplementedError

    def advice(self) -> str:
        """What to do next, for a caller of the library; "" where the problem says it all."""
        return ""

    def __str__(self) -> str:
        advice = self.advice()
        return f"{self.problem()}; {advice}" if advice else self.problem()


@dataclasses.dataclass(eq=False)
class SpecError(Fielded, UserError):
    """A tuning spec that does not validate. Names the file and the field."""

    path: str
    field: str
    reason: str

    def problem(self) -> str:
        return f"{self.path}: {self.field}: {self.reason}"


@dataclasses.dataclass(eq=False)
class OptionError(Fielded, UserError):
    """An option given to a library call that it does not take: names the option (``option``, as
    the call's keyword), the value and what it takes (``reason``: "must be ...")."""

    option: str
    value: object
    reason: str

    def problem(self) -> str:
        return f"{self.option}: {self.reason}"


class ResultsError(TunectlError):
    """The results dataset cannot be read or written as asked."""


@dataclasses.dataclass(eq=False)
class NoResultsError(Fielded, ResultsError, UserError):
    """The results asked for are not there: no ``results`` directory (``is_dir`` False), no dataset
    in it, no ``run`` of that id, or no results of ``task`` (``held``: the tasks it holds)."""

    results: Path
    is_dir: bool = False
    run: str | None = None
    task: str | None = None
    held: tuple[str, ...] = ()

    def problem(self) -> str:
        if self.run is not None:
            return f"no run {self.run!r} in {self.results}" + ("" if self.is_dir else " (no such directory)")
        if self.task is not None:
            held = f"it holds {', '.join(self.held)}" if self.held else "it holds none"
            return f"no results of task {self.task!r} in {self.results} ({held})"
        if self.is_dir:
            return f"{self.results} is not a results dataset (no runs, no task=*/run_id=* parts)"
        return f"no results dataset at {self.results} (no such directory)"


class BundleError(TunectlError):
    """A bundle cannot be built, published or loaded."""


@dataclasses.dataclass(eq=False)
class BundleExistsError(Fielded, BundleError, UserError):
    """Publishing a name/version that already exists (versions are immutable); ``location``: where
    that version is, as ``load_bundle`` takes it."""

    name: str
    version: str
    location: str

    def problem(self) -> str:
        return f"bundle {self.name}/{self.version} already exists at {self.location}"

    def advice(self) -> str:
        return "versions are immutable: publish a new one"
