"""What a command shows while a run measures: a progress bar, the run's events above it, and what a
stop (Ctrl-C, a cancel) leaves and how to go on."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tunectl import api
from tunectl.cli._common import fail, library_errors

R = TypeVar("R")


class RunBar:
    """Progress bar over the items of a run, counting failures as they come."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[failed]} failed"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.task_id: Any = None
        self.compile_id: Any = None
        self.failed = 0

    def start(self, run_id: str, total: int, placement: Any) -> None:
        pools = placement.pools
        once = f", once per accelerator type: {', '.join(pools)}" if len(pools) > 1 else ""
        self.console.print(
            f"run [bold]{run_id}[/]: ~{total} measurements on {placement.num_workers} {placement.kind} "
            f"worker(s){_resident(placement)} across {placement.num_nodes} node(s){once}"
        )
        self.bar.start()
        self.task_id = self.bar.add_task("measuring", total=total, failed=0)

    def record(self, record: Any) -> None:
        self.failed += record.failed
        task = self.bar.tasks[self.task_id]
        total = max(task.total or 0, task.completed + 1)  # a search may measure more than estimated
        self.bar.update(self.task_id, advance=1, failed=self.failed, total=total)

    def compiles(self, built: int, total: int, building: int) -> None:
        """A second line while compile processes build kernels ahead: built of total, and how many now."""
        if self.task_id is None or not total:
            return
        if self.compile_id is None:
            self.compile_id = self.bar.add_task("compiling", total=total, failed=0)
        description = f"compiling ({building} now)" if building else "compiling"
        self.bar.update(self.compile_id, completed=built, total=total, description=description)

    def stop(self) -> None:
        if self.task_id is not None:  # a run refused before it started drew nothing: nothing to end
            self.bar.stop()


class _ConsoleLog(logging.Handler):
    """The run's events on the console, above the progress bar (all of them when not a terminal)."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.INFO if not console.is_terminal else logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(record, "console", True):  # an event for the run's log only
            return
        style = "yellow" if record.levelno >= logging.WARNING else "dim"
        self.console.print(f"[{style}]{record.getMessage()}[/]", highlight=False, markup=True)


@contextlib.contextmanager
def run_events(console: Console) -> Iterator[None]:
    """Show the run's events on the console, and turn SIGTERM (a cancel) into a clean stop."""
    logger = logging.getLogger("tunectl.run")
    handler = _ConsoleLog(console)
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    previous = signal.signal(signal.SIGTERM, api.cancel_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        logger.removeHandler(handler)
        logger.propagate = propagate


def measured(console: Console, what: str, results: Path, measure: Callable[[RunBar], R]) -> R:
    """``measure(bar)`` with a progress bar and library errors as one line; Ctrl-C says what is kept."""
    bar = RunBar(console)
    try:
        with library_errors(_same_command), run_events(console):
            return measure(bar)
    except KeyboardInterrupt as exc:
        run_id = getattr(exc, "run_id", None)
        if run_id:
            kept = f"what was measured is kept in {results}"
            raise fail(f"{what} run {run_id} stopped; {kept}; {_same_command(run_id)}", 130) from None
        raise fail(f"stopped before the {what} run started; run the command again", 130) from None
    finally:
        bar.stop()


def _same_command(run_id: str) -> str:
    return f"finish it with the same command and --resume {run_id}"


def stopped_message(exc: KeyboardInterrupt, results: Path) -> str:
    """What a stop leaves, and how to go on: by the run's id once the run exists."""
    run_id = getattr(exc, "run_id", None)
    if run_id is None:
        return "stopped before the run started; nothing was written"
    if getattr(exc, "state", None) == "finished":
        return f"run {run_id} had finished, every item measured, when it was stopped; its results: {results}"
    return (
        f"run {run_id} stopped ({getattr(exc, 'state', 'interrupted')}); what was measured is kept. "
        f"Finish it with `tunectl submit --resume {run_id} --results {results}`"
    )


def _resident(placement: Any) -> str:
    """Which of a run's workers the cluster kept between runs (``tunectl workers up``)."""
    count = placement.num_resident
    if not count:
        return ""
    return " (resident)" if count == placement.num_workers else f" ({count} resident)"
