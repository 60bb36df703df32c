"""The results dataset: Parquet, hive-partitioned by task and run, appended atomically.

Layout under the results root::

    task=<task>/run_id=<run>/part-<seq>-<rand>.parquet    one file per flush
    _runs/<run>.json                                      run metadata (tunectl.runs)

Each part is written to a dot-file beside its final name, fsynced and renamed into place, so a
crash leaves either the whole part or nothing a reader sees (readers skip dot- and underscore-
files, as pyarrow, pandas and DuckDB do). Rows are never rewritten: a re-measured item in the same
run (a retry after a lost worker) is resolved on read, the last finished row winning.

This is the one module that imports pyarrow.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tunectl.errors import ResultsError
from tunectl.files import atomic_write
from tunectl.record import RECORD_FIELDS, Record, latest

SCHEMA_VERSION = 1
PARTITIONS = ("task", "run_id")
__all__ = ["SCHEMA_VERSION", "ResultsWriter", "atomic_write", "done_item_ids", "read_results"]
_TIMESTAMPS = ("started_at", "finished_at")
_FLOAT_SUFFIXES = ("_us", "_ms", "_noise", "_err", "_mhz", "_c", "_w")


def _schema() -> Any:
    import pyarrow as pa

    types = {
        "is_default": pa.bool_(),
        "throttled": pa.bool_(),
        "num_samples": pa.int64(),
        "bytes_moved": pa.int64(),
        "rung": pa.int64(),
        "rounds": pa.int64(),
        "layers": pa.int64(),
    }
    cols = []
    for name in RECORD_FIELDS:
        if name in PARTITIONS:
            continue
        if name in _TIMESTAMPS:
            cols.append(pa.field(name, pa.timestamp("us", tz="UTC")))
        elif name in types:
            cols.append(pa.field(name, types[name]))
        elif name.startswith("speedup") or name.endswith(_FLOAT_SUFFIXES):
            cols.append(pa.field(name, pa.float64()))
        else:
            cols.append(pa.field(name, pa.string()))
    return pa.schema(cols, metadata={"tunectl.schema_version": str(SCHEMA_VERSION)})


def _partitioning() -> Any:
    import pyarrow as pa
    import pyarrow.dataset as ds

    return ds.partitioning(pa.schema([("task", pa.string()), ("run_id", pa.string())]), flavor="hive")


class ResultsWriter:
    """Buffers records and flushes them as atomic Parquet parts (by count or by age)."""

    def __init__(self, root: str | Path, max_rows: int = 256, max_age_s: float = 2.0) -> None:
        self.root = Path(root)
        self.max_rows, self.max_age_s = max_rows, max_age_s
        self._buffer: list[Record] = []
        self._oldest = 0.0
        self._seq = 0
        self.rows_written = 0

    def append(self, record: Record) -> None:
        if not self._buffer:
            self._oldest = time.monotonic()
        self._buffer.append(record)
        if len(self._buffer) >= self.max_rows or time.monotonic() - self._oldest >= self.max_age_s:
            self.flush()

    def flush(self) -> None:
        by_part: dict[tuple[str, str], list[Record]] = {}
        for rec in self._buffer:
            by_part.setdefault((rec.task, rec.run_id), []).append(rec)
        for (task, run_id), records in by_part.items():
            self._write_part(task, run_id, records)
        self._buffer.clear()

    def close(self) -> None:
        self.flush()

    def _write_part(self, task: str, run_id: str, records: Sequence[Record]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns: dict[str, list[Any]] = {n: [] for n in _schema().names}
        for rec in records:
            row = rec.to_row()
            for name in columns:
                value = row[name]
                columns[name].append(int(value * 1e6) if name in _TIMESTAMPS else value)
        table = pa.table(
            {n: pa.array(v, type=_schema().field(n).type) for n, v in columns.items()}, schema=_schema()
        )
        directory = self.root / f"task={task}" / f"run_id={run_id}"
        directory.mkdir(parents=True, exist_ok=True)
        self._seq += 1
        name = f"part-{int(time.time() * 1e3):013d}-{self._seq:05d}-{secrets.token_hex(4)}.parquet"
        atomic_write(directory / name, lambda f: pq.write_table(table, f, compression="zstd"))
        self.rows_written += len(records)


def read_results(
    root: str | Path, run_ids: Iterable[str] | None = None, task: str | None = None
) -> list[Record]:
    """The dataset's records (optionally of some runs or one task), one per (run, item): the last
    finished where an item was measured again. Rows written by earlier versions read as records too."""
    import pyarrow.dataset as ds

    root = Path(root)
    if not root.is_dir():
        raise ResultsError(f"no results dataset at {root}")
    files = sorted(str(p) for p in root.glob("task=*/run_id=*/*.parquet"))  # not what else lives there
    if not files:
        return []
    try:
        dataset = ds.dataset(
            files, format="parquet", partitioning=_partitioning(), partition_base_dir=str(root),
            schema=_full_schema(),
        )  # fmt: skip
        flt = None
        if run_ids is not None:
            flt = ds.field("run_id").isin(list(run_ids))
        if task is not None:
            cond = ds.field("task") == task
            flt = cond if flt is None else flt & cond
        rows = dataset.to_table(filter=flt).to_pylist()
    except OSError as exc:
        raise ResultsError(f"cannot read results at {root}: {exc}") from None
    try:
        records = [Record.from_row(row) for row in rows]
    except ValueError as exc:
        raise ResultsError(f"results at {root} hold a row this version cannot read: {exc}") from None
    return list(latest(records, key=lambda r: (r.run_id, r.item_id)).values())


def _full_schema() -> Any:
    import pyarrow as pa

    base = _schema()
    return pa.schema(list(base) + [pa.field(p, pa.string()) for p in PARTITIONS], metadata=base.metadata)


def done_item_ids(root: str | Path, run_id: str) -> set[str]:
    """Items of ``run_id`` that already have a row (what a resume skips)."""
    if not Path(root).is_dir():
        return set()
    return {record.item_id for record in read_results(root, run_ids=[run_id])}
