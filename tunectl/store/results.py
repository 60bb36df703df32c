"""The results dataset: Parquet, hive-partitioned by task and run, appended atomically.

Layout under the results root::

    task=<task>/run_id=<run>/part-<seq>-<rand>.parquet    one file per flush
    _runs/<run>.json                                      run metadata (tunectl.store.runs)

Each part is written to a dot-file beside its final name, fsynced and renamed into place, so a
crash leaves either the whole part or nothing a reader sees (readers skip dot- and underscore-
files, as pyarrow, pandas and DuckDB do). Rows are never rewritten: a re-measured item in the same
run (a retry after a lost worker) is resolved on read, the last finished row winning.

This is the one module that imports pyarrow.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunectl.core.errors import Fielded, NoResultsError, ResultsError
from tunectl.core.files import atomic_write, move
from tunectl.core.record import Record, latest, record_types

#: 1: the first; 2: the drift guard's ``probe_us`` is ``reference_us`` (a part of 1 still reads, below)
SCHEMA_VERSION = 2
PARTITIONS = ("task", "run_id")
__all__ = [
    "SCHEMA_VERSION",
    "BadPart",
    "DamagedPart",
    "Dataset",
    "NoResultsError",
    "ResultsWriter",
    "atomic_write",
    "check_parts",
    "done_item_ids",
    "part_files",
    "quarantine",
    "read_dataset",
    "read_part",
    "read_part_records",
    "read_results",
    "require_dataset",
    "require_task",
]
_TIMESTAMPS = ("started_at", "finished_at")
log = logging.getLogger("tunectl.store.results")


def _schema() -> Any:
    """The parts' schema, from ``Record``'s fields: a column per field (the partitions left out), its
    type the field's (a timestamp for the start and finish, a string for an enum)."""
    import pyarrow as pa

    arrow = {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}
    cols = []
    for name, kind in record_types().items():
        if name in PARTITIONS:
            continue
        cols.append(pa.field(name, pa.timestamp("us", tz="UTC") if name in _TIMESTAMPS else arrow[kind]))
    return pa.schema(cols, metadata={"tunectl.schema_version": str(SCHEMA_VERSION)})


class ResultsWriter:
    """Buffers records and flushes them as atomic Parquet parts (by count or by age).

    The unit of writing is an item's records (``append_item``): one row for a plain item, one per
    arm for a comparison (``group_id``). An item's records always land in one part, so a driver
    killed at any moment leaves each comparison on disk whole or not at all, and a resume that
    measures it again never writes a second copy of an arm.
    """

    def __init__(self, root: str | Path, max_rows: int = 256, max_age_s: float = 2.0) -> None:
        self.root = Path(root)
        self.max_rows, self.max_age_s = max_rows, max_age_s
        self._buffer: list[Record] = []
        self._oldest = 0.0
        self._seq = 0
        self.rows_written = 0

    @property
    def buffered(self) -> int:
        """Records appended and not yet written."""
        return len(self._buffer)

    def append(self, record: Record) -> None:
        """One plain item's record (a comparison's arms go through ``append_item`` together)."""
        self.append_item([record])

    def append_item(self, records: Sequence[Record]) -> None:
        """All records of one item; they are flushed together, never split across parts."""
        if not records:
            return
        if not self._buffer:
            self._oldest = time.monotonic()
        self._buffer.extend(records)
        if len(self._buffer) >= self.max_rows or time.monotonic() - self._oldest >= self.max_age_s:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered, one part per (task, run). Each part's records leave the buffer before
        it is written and come back only where it did not land: a stop (Ctrl-C, a cancel) at any
        moment of a flush never leaves a landed record buffered, so the flush on the way out never
        writes one twice (at worst a record that did not land is left to a resume, never doubled)."""
        while self._buffer:
            key = (self._buffer[0].task, self._buffer[0].run_id)
            records = [r for r in self._buffer if (r.task, r.run_id) == key]
            self._buffer = [r for r in self._buffer if (r.task, r.run_id) != key]
            path = self._next_path(*key)
            try:
                self._write_part(path, records)
            except BaseException:
                if not path.exists():  # it did not land: the next flush writes it
                    self._buffer = records + self._buffer
                raise
            self.rows_written += len(records)

    def close(self) -> None:
        self.flush()

    def _next_path(self, task: str, run_id: str) -> Path:
        directory = self.root / f"task={task}" / f"run_id={run_id}"
        directory.mkdir(parents=True, exist_ok=True)
        self._seq += 1
        return (
            directory / f"part-{int(time.time() * 1e3):013d}-{self._seq:05d}-{secrets.token_hex(4)}.parquet"
        )

    def _write_part(self, path: Path, records: Sequence[Record]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = _schema()
        columns: dict[str, list[Any]] = {n: [] for n in schema.names}
        for rec in records:
            row = rec.to_row()
            for name in columns:
                value = row[name]
                columns[name].append(int(value * 1e6) if name in _TIMESTAMPS else value)
        table = pa.table(
            {n: pa.array(v, type=schema.field(n).type) for n, v in columns.items()}, schema=schema
        )
        atomic_write(path, lambda f: pq.write_table(table, f, compression="zstd"))


#: columns every part has had since the first schema; a file without them is not a results part
_REQUIRED = ("item_id", "status", "finished_at")
#: columns renamed since the first schema, by their name now: a part written before reads the old one
_FORMER_NAMES = {"reference_us": "probe_us"}
_warned: set[str] = set()


@dataclass(frozen=True)
class DamagedPart:
    """A part of the dataset no reader can use, and why; its rows are missing from every read."""

    path: Path
    why: str

    @property
    def task(self) -> str:
        return self.path.parent.parent.name.removeprefix("task=")

    @property
    def run_id(self) -> str:
        return self.path.parent.name.removeprefix("run_id=")


@dataclass(eq=False)
class BadPart(Fielded, ResultsError):
    """A Parquet file under the dataset that cannot be read as results (damaged, empty, foreign):
    its ``path`` and ``why``."""

    path: Path
    why: str

    def problem(self) -> str:
        return f"{self.path}: {self.why}"

    @property
    def part(self) -> DamagedPart:
        return DamagedPart(self.path, self.why)


@dataclass(frozen=True)
class Dataset:
    """What a read of the dataset found: the records, and the parts it could not read."""

    records: list[Record]
    damaged: tuple[DamagedPart, ...] = ()

    @property
    def damaged_runs(self) -> tuple[str, ...]:
        """The runs that lost rows to unreadable parts, in order."""
        return tuple(sorted({part.run_id for part in self.damaged}))


def require_dataset(root: str | Path) -> Path:
    """``root`` as a Path if it holds a results dataset (runs or parts); else a ``NoResultsError``."""
    root = Path(root)
    if not root.is_dir():
        raise NoResultsError(root)
    if not (root / "_runs").is_dir() and not any(root.glob("task=*/run_id=*")):
        raise NoResultsError(root, is_dir=True)
    return root


def require_task(root: str | Path, task: str) -> None:
    """A ``NoResultsError`` unless ``root`` holds results of ``task``, naming the tasks it holds."""
    tasks = sorted({p.name.removeprefix("task=") for p in Path(root).glob("task=*") if p.is_dir()})
    if task not in tasks:
        raise NoResultsError(Path(root), Path(root).is_dir(), task=task, held=tuple(tasks))


def part_files(root: str | Path, run_ids: Iterable[str] | None = None, task: str | None = None) -> list[Path]:
    """The dataset's visible Parquet parts (readers skip dot- and underscore-files), in name order."""
    wanted = None if run_ids is None else set(run_ids)
    parts = []
    for path in sorted(Path(root).glob("task=*/run_id=*/*.parquet")):
        if path.name.startswith((".", "_")):
            continue
        if task is not None and path.parent.parent.name != f"task={task}":
            continue
        if wanted is not None and path.parent.name.removeprefix("run_id=") not in wanted:
            continue
        parts.append(path)
    return parts


def read_part(path: str | Path) -> Any:
    """One part as a table in the current schema (older parts gain null columns, and a renamed column
    reads under its name now); ``BadPart`` if not."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        if path.stat().st_size == 0:
            raise BadPart(path, "empty file (0 bytes)")
        table = pq.read_table(path)
    except BadPart:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise BadPart(path, f"not a readable Parquet file ({_first_line(exc)})") from None
    missing = [n for n in _REQUIRED if n not in table.column_names]
    if missing:
        raise BadPart(path, f"not a tunectl results part (no column {missing[0]!r})")
    schema = _schema()
    columns = []
    for fld in schema:
        name = fld.name if fld.name in table.column_names else _FORMER_NAMES.get(fld.name, fld.name)
        if name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, fld.type))
            continue
        try:
            columns.append(table.column(name).cast(fld.type))
        except (pa.ArrowException, ValueError) as exc:
            why = f"column {name!r} has type {table.schema.field(name).type}, not {fld.type}"
            raise BadPart(path, f"{why} ({_first_line(exc)})") from None
    return pa.Table.from_arrays(columns, schema=schema)


def read_part_records(path: str | Path) -> list[Record]:
    """One part's records, its task and run taken from its directories; ``BadPart`` if it holds a row
    this version cannot read (a status or phase it does not know)."""
    path = Path(path)
    rows = read_part(path).to_pylist()
    task, run_id = path.parent.parent.name.removeprefix("task="), path.parent.name.removeprefix("run_id=")
    try:
        return [Record.from_row({**row, "task": task, "run_id": run_id}) for row in rows]
    except (ValueError, TypeError) as exc:
        raise BadPart(path, f"holds a row this version cannot read ({_first_line(exc)})") from None


def check_parts(root: str | Path) -> list[BadPart]:
    """Every part of the dataset that cannot be read, with why (``tunectl doctor``)."""
    bad = []
    for path in part_files(root):
        try:
            read_part_records(path)
        except BadPart as exc:
            bad.append(exc)
    return bad


QUARANTINE_DIR = "_quarantine"


def quarantine(root: str | Path, paths: Iterable[str | Path]) -> list[tuple[Path, Path]]:
    """Move ``paths`` (files under ``root``) to ``root/_quarantine/`` at the same relative path, where
    no reader looks; nothing is deleted. Returns (from, to) per file moved."""
    root = Path(root)
    moved = []
    for path in map(Path, paths):
        target = root / QUARANTINE_DIR / path.resolve().relative_to(root.resolve())
        if target.exists():  # the same name quarantined before: keep both
            target = target.with_name(f"{target.name}.{secrets.token_hex(3)}")
        move(path, target, make_parents=True)
        moved.append((path, target))
    return moved


def _first_line(exc: BaseException) -> str:
    line = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    return _SOURCE.sub("", line).split(". ")[0]  # the path is said once, by whoever reports the part


#: pyarrow's prefix naming the file it could not open
_SOURCE = re.compile(r"^Could not open Parquet input source '[^']*': ")


def read_dataset(root: str | Path, run_ids: Iterable[str] | None = None, task: str | None = None) -> Dataset:
    """The dataset's records (optionally of some runs or one task), one per (run, item): the last
    finished where an item was measured again, and the parts that could not be read (damaged, empty,
    of another schema), whose rows are missing. Rows written by earlier versions read as records too.
    """
    root = Path(root)
    if not root.is_dir():
        raise NoResultsError(root)
    records: list[Record] = []
    damaged: list[DamagedPart] = []
    for path in part_files(root, run_ids, task):
        try:
            records.extend(read_part_records(path))
        except BadPart as exc:
            damaged.append(exc.part)
    return Dataset(list(latest(records, key=lambda r: (r.run_id, r.item_id)).values()), tuple(damaged))


def read_results(
    root: str | Path, run_ids: Iterable[str] | None = None, task: str | None = None
) -> list[Record]:
    """``read_dataset``'s records; each part that cannot be read is skipped with one warning per
    file and process (logger ``tunectl.store.results``); ``tunectl doctor`` lists and quarantines them.
    """
    dataset = read_dataset(root, run_ids, task)
    for part in dataset.damaged:
        if str(part.path) not in _warned:
            _warned.add(str(part.path))
            log.warning(
                "skipped %s: %s; `tunectl doctor --results %s` lists such files", part.path, part.why, root
            )
    return dataset.records


def done_item_ids(root: str | Path, run_id: str) -> set[str]:
    """Items of ``run_id`` that already have a row (what a resume skips)."""
    if not Path(root).is_dir():
        return set()
    return {record.item_id for record in read_results(root, run_ids=[run_id])}
