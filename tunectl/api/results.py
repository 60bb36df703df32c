"""Reading what runs measured: the records, the winners and how far to trust them, where each
worker's time went, the files no reader can use, the HTML report, and other tuners' logs brought in
as runs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tunectl.core.record import Record
from tunectl.decide.quality import Quality
from tunectl.decide.select import Winner
from tunectl.formats.flexlog import ImportResult
from tunectl.report import ReportResult
from tunectl.report.worker_time import WorkerTime
from tunectl.store.results import Dataset


@dataclass(frozen=True)
class Selection:
    """Which records: those of some runs (None: every run) of one task (None: every task)."""

    run_ids: Sequence[str] | None = None
    task: str | None = None


def records(results: str | Path, selection: Selection | None = None) -> list[Record]:
    """One record per (run, item) of ``selection``, once the dataset, every named run and the task are
    known to exist (else ``UserError``); an unreadable file is skipped with a warning."""
    from tunectl.store.results import read_results

    selection = _checked(results, selection)
    return read_results(results, run_ids=selection.run_ids, task=selection.task)


@dataclass(frozen=True)
class Winners:
    dataset: Dataset  # what they were chosen from, with the parts that could not be read
    winners: list[Winner]
    quality: Quality  # the flags on the rows each winner rests on


def winners(results: str | Path, selection: Selection | None = None) -> Winners:
    """The winner per point of ``selection``'s records, each whose point lost rows to an unreadable
    file saying so, and the quality of the rows they rest on."""
    from tunectl.formats.export import assessed_winners
    from tunectl.store.results import read_dataset

    selection = _checked(results, selection)
    dataset = read_dataset(results, run_ids=selection.run_ids, task=selection.task)
    chosen, quality = assessed_winners(results, dataset)
    return Winners(dataset, chosen, quality)


def worker_times(records: Iterable[Record], since: float = 0.0) -> list[WorkerTime]:
    """Where each worker's time went over ``records`` that started at or after ``since`` (epoch
    seconds): its span, the tuned kernels' share of it, measuring, loading, set-up and waiting for
    work (``tunectl.report.worker_time``)."""
    from tunectl.report.worker_time import worker_times as times_of

    return times_of(records, since)


def run_quality(results: str | Path, run_id: str) -> Quality:
    """The quality of the rows a validation run's comparisons rest on."""
    from tunectl.decide.quality import run_quality as quality_of

    return quality_of(results, run_id)


def _checked(results: str | Path, selection: Selection | None) -> Selection:
    from tunectl.store.results import require_dataset, require_task
    from tunectl.store.runs import require_runs

    selection = selection or Selection()
    require_runs(require_dataset(results), selection.run_ids or [])
    if selection.task is not None:
        require_task(results, selection.task)
    return selection


@dataclass(frozen=True)
class Checkup:
    root: Path
    damaged: tuple[tuple[str, str], ...]  # (path, why) of each file no reader can use
    moved: tuple[tuple[Path, Path], ...] = ()  # (from, to) of each file quarantined


def doctor(results: str | Path, *, quarantine: bool = False) -> Checkup:
    """The files of ``results`` that cannot be read (damaged, empty or foreign Parquet parts,
    unreadable run metadata); with ``quarantine``, moved to ``_quarantine/`` (nothing is deleted)."""
    from tunectl.store.results import check_parts, require_dataset
    from tunectl.store.results import quarantine as move_aside
    from tunectl.store.runs import check_run_files

    root = require_dataset(results)
    bad = [(str(exc.path), str(exc)) for exc in check_parts(root)]
    bad += [(str(path), str(exc)) for path, exc in check_run_files(root)]
    moved = move_aside(root, [path for path, _ in bad]) if quarantine and bad else []
    return Checkup(root, tuple(bad), tuple(moved))


def report(
    results: str | Path, out: str | Path, *, bundle: str | None = None, run_ids: Sequence[str] | None = None
) -> ReportResult:
    """Write ``out/index.html`` and its plots from ``results`` (some runs of it), and the bundle at
    ``bundle`` (a directory, archive, URI or STORE/NAME@CHANNEL) beside them."""
    from tunectl.report import write_report

    return write_report(results, out, bundle, run_ids)


def import_flex_log(
    path: str | Path, results: str | Path, *, run_id: str | None = None, options_out: str | Path | None = None
) -> ImportResult:
    """Add every choice of an Inductor FlexAttention autotuning log to ``results`` as rows of an import
    run (``run_id``: an earlier one to add to); ``options_out``: also write each shape's winners as
    kernel_options there."""
    from tunectl.formats.flexlog import import_flex_log as import_log

    return import_log(path, results, run_id, options_out)
