"""The Parquet dataset: atomic appends, readable by pyarrow, pandas and DuckDB, deduplicated reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunectl.core.record import Record
from tunectl.store.results import ResultsWriter, atomic_write, done_item_ids, read_results


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
    assert [r.item_id for r in read_results(tmp_path)] == ["a"]


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
    assert len(rows) == 1 and rows[0].median_us == 7.0


def test_other_files_under_the_root_are_not_read_as_results(tmp_path: Path) -> None:
    writer = ResultsWriter(tmp_path)
    writer.append(_record("r1", "i1"))
    writer.close()
    store = tmp_path / "bundles" / "b" / "1"  # a bundle store kept beside the results
    store.mkdir(parents=True)
    (store / "manifest.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("not parquet")
    assert [r.item_id for r in read_results(tmp_path)] == ["i1"]


def test_rows_from_before_phases_read_as_full_measurements(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    part = tmp_path / "task=t" / "run_id=old"
    part.mkdir(parents=True)
    stamp = pa.array([1], type=pa.timestamp("us", tz="UTC"))
    table = pa.table({"item_id": ["i1"], "status": ["ok"], "median_us": [1.0], "finished_at": stamp})
    pq.write_table(table, part / "p.parquet")
    [row] = read_results(tmp_path)
    assert row.phase == "measure" and row.group_id == "" and row.run_id == "old"


def test_a_part_written_with_the_old_probe_us_column_reads_it_as_reference_us(tmp_path: Path) -> None:
    """Parts of schema 1 name the drift guard's reading ``probe_us``; it reads under its name now,
    typed as it was written, beside a part of the current schema in the same dataset."""
    import dataclasses

    import pyarrow.parquet as pq

    from tunectl.store.results import part_files, read_part

    writer = ResultsWriter(tmp_path)
    writer.append(dataclasses.replace(_record("old", "i1"), reference_us=201.5, reference_ratio=1.2))
    writer.close()
    [old] = part_files(tmp_path)
    table = pq.read_table(old)  # as an older version wrote it: the column under its old name
    table = table.rename_columns(["probe_us" if n == "reference_us" else n for n in table.column_names])
    pq.write_table(table.replace_schema_metadata({"tunectl.schema_version": "1"}), old)
    assert "probe_us" in pq.read_schema(old).names and "reference_us" not in pq.read_schema(old).names
    writer = ResultsWriter(tmp_path)
    writer.append(dataclasses.replace(_record("new", "i1"), reference_us=99.0))
    writer.close()

    assert read_part(old).column("reference_us").to_pylist() == [201.5]
    assert "probe_us" not in read_part(old).column_names
    back = {r.run_id: r for r in read_results(tmp_path)}
    assert (back["old"].reference_us, back["old"].reference_ratio) == (201.5, 1.2)
    assert back["new"].reference_us == 99.0


def _tiny_run(root: Path, state: str) -> None:
    """Run r1 of the tiny spec, recorded in ``state``, with one ok row and one crash row of one point."""
    from tests.conftest import TINY_SPEC
    from tunectl.store.runs import RunInfo, save_run

    save_run(root, RunInfo("r1", "tiny", "decode_attention", "tiny.toml", TINY_SPEC, state, 2, 1.0, 1.0))
    at = {
        "run_id": "r1", "task": "decode_attention", "shape_key": '{"batch":1,"kv_len":64}',
        "static_key": '{"dtype":"float32","head_dim":16,"num_kv_heads":2,"num_q_heads":4,"page_size":8}',
    }  # fmt: skip
    ok = Record(
        **at, item_id="a", config_key='{"gather":"index","gqa":"expand","num_splits":1}', is_default=True,
        status="ok", median_us=5.0, p20_us=5.0, p80_us=5.0, rel_noise=0.0, num_samples=3, device_name="H200",
    )  # fmt: skip
    crash = Record(  # written by the driver for a worker that died: it names no device
        **at, item_id="b", config_key='{"gather":"index","gqa":"grouped","num_splits":2}', is_default=False,
        status="crash",
    )  # fmt: skip
    writer = ResultsWriter(root)
    writer.append(ok)
    writer.append(crash)
    writer.close()


def test_a_crash_record_without_a_device_does_not_split_an_export(tmp_path: Path) -> None:
    from tunectl.formats.export import prepare_bundle

    _tiny_run(tmp_path, "finished")
    prepared = prepare_bundle(tmp_path, "b", "1")
    assert [w.device_name for w in prepared.winners] == ["H200"]
    assert prepared.result("here").notes() == []


@pytest.mark.parametrize("state", ["cancelled", "failed"])
def test_an_export_from_a_run_that_did_not_finish_says_so_and_how_to_finish_it(
    tmp_path: Path, state: str
) -> None:
    from tunectl.formats.export import prepare_bundle

    _tiny_run(tmp_path, state)
    prepared = prepare_bundle(tmp_path, "b", "1")
    assert prepared.unfinished == (("r1", state),)
    (note,) = prepared.result("here").notes()
    assert f"run r1 is {state}, not finished" in note and "tunectl submit --resume r1" in note


def test_every_field_reads_back_with_the_type_it_was_written_with(tmp_path: Path) -> None:
    """The parts' column types come from ``Record``'s own fields: a whole number stays one, a flag a
    flag, a time a float, so no field is stored as text for want of a name the store knows."""
    from tunectl.core.record import record_types

    values = {bool: True, int: 7, float: 2.5, str: "x"}
    fixed = {"status": "ok", "phase": "final", "measure_mode": "graph", "timing": "difference"}
    record = Record(**{
        name: fixed.get(name, values[kind]) for name, kind in record_types().items()
        if name not in ("started_at", "finished_at", "run_id", "task")
    }, run_id="r1", task="t", started_at=1.5, finished_at=2.5)  # fmt: skip
    writer = ResultsWriter(tmp_path)
    writer.append(record)
    writer.close()
    [back] = read_results(tmp_path)
    assert back == record
    for name, kind in record_types().items():  # an enum's value is its text; no bool reads as an int
        assert type(getattr(back, name)) is kind or (kind is str and isinstance(getattr(back, name), str)), (
            name
        )
