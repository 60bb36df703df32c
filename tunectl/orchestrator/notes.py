"""What worker and compile processes say on the side: Python warnings and the logs of the libraries they
load (torch, Triton, FlashInfer, CUTLASS, tunectl's own), kept out of the console and in the run's log.

Ray forwards a worker's stderr to the driver's console, so a warning a kernel library raises once per
compile would scroll the progress bar away. Each worker and compile process instead installs
``ProcessNotes`` when it starts: warnings and those loggers' records are counted by kind and text, and
handed back when the process is closed (``drain``). What the process prints besides (its file
descriptors 1 and 2: a library's own log format, a compiler's traceback, C++ code's output) goes to a
file of its own rather than to Ray, and its lines are counted the same way, as kind ``printed``.
The driver writes them to the run's log (``tunectl logs RUN``) and says on the console, per kind, how
many there were (``summary_lines``). What a process says in its last moments before it dies is lost
with it; its death is reported anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

#: loggers whose records (WARNING and above) go to the run's log rather than the console
NOISY_LOGGERS = ("torch", "triton", "flashinfer", "cutlass", "cuda", "tunectl")
MAX_TEXTS = 500  # distinct texts kept per process; the rest are counted under their kind
MAX_LINE = 300  # characters kept of a printed line
log = logging.getLogger("tunectl.run")
#: a run event for its log only: the console leaves out records carrying this (``extra=LOG_ONLY``)
LOG_ONLY = {"console": False}


@dataclass(frozen=True)
class Note:
    """``count`` times ``text`` of ``kind`` (a warning's category, or a logger's name) from ``source``."""

    kind: str
    text: str
    count: int
    source: str = ""


class ProcessNotes(logging.Handler):
    """Counts this process's warnings and the noisy loggers' records by (kind, text)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[tuple[str, str]] = Counter()
        self._printed: BinaryIO | None = None  # where this process's output is read back from

    def capture_output(self) -> None:
        """Point file descriptors 1 and 2 at a file of this process's own (appended to; gone with the
        process), so what anything prints there is counted by ``drain`` and never reaches Ray."""
        fd, path = tempfile.mkstemp(prefix="tunectl-output-")
        os.close(fd)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        sink = os.open(path, os.O_WRONLY | os.O_APPEND)
        self._printed = open(path, "rb")  # noqa: SIM115  # read back for the process's life
        os.unlink(path)
        for target in (1, 2):
            os.dup2(sink, target)
        os.close(sink)

    def _read_printed(self) -> None:
        if self._printed is None:
            return
        for line in self._printed.read().decode("utf-8", "replace").splitlines():
            if line.strip():
                self.add("printed", line.strip()[:MAX_LINE])

    def add(self, kind: str, text: str) -> None:
        key = (kind, text)
        if key not in self.counts and len(self.counts) >= MAX_TEXTS:
            key = (kind, "(more of this kind, not kept)")
        self.counts[key] += 1

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.add(record.name, record.getMessage().strip())
        except Exception:  # a record that cannot be formatted is not worth a crash
            self.handleError(record)

    def show_warning(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        """``warnings.showwarning`` for this process: counted, never printed."""
        self.add(category.__name__, f"{message} ({Path(filename).name}:{lineno})")

    def drain(self, source: str = "") -> list[Note]:
        """What was counted since the last drain, most frequent first; the counts start again."""
        self._read_printed()
        notes = [Note(kind, text, n, source) for (kind, text), n in self.counts.most_common()]
        self.counts.clear()
        return notes


def install(loggers: Sequence[str] = NOISY_LOGGERS, *, output: bool = False) -> ProcessNotes:
    """Route this process's warnings and ``loggers`` (and with ``output``, what it prints) into a new
    ``ProcessNotes`` (for good: a worker or compile process calls it once, when it starts)."""
    notes = ProcessNotes()
    if output:
        notes.capture_output()
    warnings.showwarning = notes.show_warning
    for name in loggers:
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if not isinstance(h, logging.FileHandler)]:
            logger.removeHandler(handler)
        logger.addHandler(notes)
        logger.propagate = False
    return notes


@contextmanager
def captured(loggers: Sequence[str] = NOISY_LOGGERS) -> Iterator[ProcessNotes]:
    """``install`` for the length of a block, everything as it was after it (for tests)."""
    showwarning = warnings.showwarning
    saved = {
        name: (list(logging.getLogger(name).handlers), logging.getLogger(name).propagate) for name in loggers
    }
    try:
        yield install(loggers)
    finally:
        warnings.showwarning = showwarning
        for name, (handlers, propagate) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers[:] = handlers
            logger.propagate = propagate


def write_notes(path: Path, notes: Iterable[Note]) -> None:
    """Append ``notes`` to the run's log at ``path``, a line each, in the log's own format."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S,000")
    lines = [f"{stamp} NOTE {n.source or 'a process'}: {n.kind} x{n.count}: {n.text}\n" for n in notes]
    if lines:
        with open(path, "a", encoding="utf-8") as log:
            log.writelines(lines)


def summary_lines(notes: Sequence[Note], where: str, most: int = 5) -> list[str]:
    """One line: how many messages there were, of which kinds (the ``most`` commonest named), and where
    to read them (``where``: the command); none where there were none."""
    kinds: Counter[str] = Counter()
    for note in notes:
        kinds[note.kind] += note.count
    if not kinds:
        return []
    named = [f"{n:,} {kind}" for kind, n in kinds.most_common(most)]
    if len(kinds) > most:
        named.append(f"{len(kinds) - most} more kind(s)")
    total = sum(kinds.values())
    return [
        f"{total:,} message(s) from worker and compile processes ({', '.join(named)}); `{where}` shows them",
        *_memory_lines(notes),
    ]


def _memory_lines(notes: Sequence[Note]) -> list[str]:
    """A line on the workers' requests out of device memory, where there were any: how often a worker
    waited for memory other processes held, for how long in all (the worker's line counts those
    seconds under "other"), and how many failed at once."""
    from tunectl.measure.memory import logged

    said = [(what, n.count) for n in notes if (what := logged(n.text)) is not None]
    if not said:
        return []
    tries = sum(count for what, count in said if not what.refused)
    seconds = sum(what.waited_s * count for what, count in said)
    refused = sum(count for what, count in said if what.refused)
    return [
        f"out of device memory: {tries} wait(s) for memory other processes held, {seconds:.1f} s in all; "
        f"{refused} request(s) failed at once, as no process could make room"
    ]


def drained(
    actors: Sequence[Any], call: Callable[[Any], Any] | None = None, timeout_s: float = 2.0
) -> list[Note]:
    """The notes of ``actors`` (workers, compile processes), from their ``close`` calls (or ``call``'s)
    answered in ``timeout_s``; those that do not answer keep theirs."""
    import ray

    refs = [a.close.remote() if call is None else call(a) for a in actors]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    notes: list[Note] = []
    for ref in ready:
        try:
            notes += ray.get(ref) or []
        except Exception:  # a process gone: its notes with it
            continue
    return notes


def keep_notes(notes: Sequence[Note], results: Path, run_id: str) -> None:
    """Write ``notes`` to run ``run_id``'s log in ``results``, and say on the console, per kind, how
    many there were and how to read them."""
    from tunectl.store.runs import results_option, run_log_path

    if not notes:
        return
    write_notes(run_log_path(results, run_id), notes)
    for line in summary_lines(notes, f"tunectl logs {run_id}{results_option(results)}"):
        log.warning(line)
