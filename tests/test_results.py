"""The Parquet dataset: atomic appends, readable by pyarrow, pandas and DuckDB, deduplicated reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunectl.record import Record
from tunectl.results import ResultsWriter, atomic_write, done_item_ids, read_results


def _record(run: str, item: str, median: float = 10.0, finished: float = 1.0, task: str = "t") -> Record:
    return Record(
        run_id=run,
        item_id=item,
        task=task,
        static_key='{"d":1}',
        shape_key='{"b":1}',
        config_key='{"c":1}',
        is_default=False,
        status="ok",
        median_us=median,
        finished_at=finished,
    )


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "part.parquet"

    def half_then_fail(f) -> None:  # type: ignore[no-untyped-def]
        f.write(b"PAR1 half a file")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, half_then_fail)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_flush_keeps_what_was_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = ResultsWriter(tmp_path)
    writer.append(_record("r1", "a"))
    writer.flush()
    import pyarrow.parquet as pq

    def broken(*args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        raise OSError("device lost")

    monkeypatch.setattr(pq, "write_table", broken)
    writer.append(_record("r1", "b"))
    with pytest.raises(OSError):
        writer.flush()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 1 and not files[0].name.startswith(".")
    assert [r["item_id"] for r in read_results(tmp_path)] == ["a"]


def test_rows_are_partitioned_and_readable_by_pandas_and_duckdb(tmp_path: Path) -> None:
    writer = ResultsWriter(tmp_path, max_rows=2)
    for i in range(5):
        writer.append(_record("r1" if i < 3 else "r2", f"i{i}", median=float(i), task="t" if i % 2 else "u"))
    writer.close()
    assert {p.parent.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.parquet")} == {
        "task=t/run_id=r1",
        "task=u/run_id=r1",
        "task=t/run_id=r2",
        "task=u/run_id=r2",
    }
    import duckdb
    import pandas as pd

    df = pd.read_parquet(tmp_path)
    assert len(df) == 5 and set(df["run_id"]) == {"r1", "r2"}
    count = (
        duckdb.connect()
        .execute(
            f"select count(*) from read_parquet('{tmp_path}/**/*.parquet', hive_partitioning=true) "
            "where run_id = 'r1'"
        )
        .fetchone()
    )
    assert count == (3,)
    assert done_item_ids(tmp_path, "r2") == {"i3", "i4"}
    assert len(read_results(tmp_path, task="u")) == 3


def test_a_re_measured_item_reads_once_latest_first(tmp_path: Path) -> None:
    writer = ResultsWriter(tmp_path)
    writer.append(_record("r1", "a", median=5.0, finished=1.0))
    writer.flush()
    writer.append(_record("r1", "a", median=7.0, finished=2.0))
    writer.close()
    rows = read_results(tmp_path)
    assert len(rows) == 1 and rows[0]["median_us"] == 7.0
