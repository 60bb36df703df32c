"""The dataset through faults: a comparison reaches disk whole or not at all, a flush interrupted
after its rename is not written twice, and damaged or foreign files are skipped with one warning
each, listed and quarantined by `tunectl doctor`, never deleted."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from tests.unit.test_results import _record
from tunectl.cli import app
from tunectl.core.record import Record
from tunectl.store.results import ResultsWriter, check_parts, part_files, read_results
from tunectl.store.runs import RunInfo, save_run


def _arms(group: str, n: int = 4, run: str = "r1") -> list[Record]:
    return [replace(_record(run, f"{group}-arm{i}"), group_id=group, phase="final") for i in range(n)]


def _raw(root: Path) -> list[tuple[str, int]]:
    """(item id, copies) per item in the raw parts, counted by DuckDB without any dedupe."""
    glob = str(root / "task=*" / "run_id=*" / "*.parquet")
    return duckdb.sql(f"select item_id, count(*) from read_parquet('{glob}') group by item_id").fetchall()


def test_a_comparison_lands_in_one_part_even_when_every_append_is_due_a_flush(tmp_path: Path) -> None:
    writer = ResultsWriter(tmp_path, max_rows=1, max_age_s=0.0)
    for group in ("g1", "g2", "g3"):
        writer.append_item(_arms(group))
    writer.close()
    import pyarrow.parquet as pq

    parts = part_files(tmp_path)

    assert sorted(len(set(pq.read_table(p).column("group_id").to_pylist())) for p in parts) == [1, 1, 1]
    assert sorted(pq.read_table(p).num_rows for p in parts) == [4, 4, 4]


def test_a_flush_interrupted_after_its_rename_is_not_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = ResultsWriter(tmp_path, max_rows=1000, max_age_s=1000.0)
    writer.append_item(_arms("g1"))
    real_fsync, calls = os.fsync, []

    def ctrl_c_after_the_rename(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:  # the first fsync is the file's, the second the directory's, after the rename
            raise KeyboardInterrupt
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", ctrl_c_after_the_rename)
    with pytest.raises(KeyboardInterrupt):
        writer.flush()
    monkeypatch.setattr(os, "fsync", real_fsync)
    writer.close()  # what the driver does on its way out
    assert sorted(_raw(tmp_path)) == [(f"g1-arm{i}", 1) for i in range(4)]


def test_a_stop_during_the_flushs_own_bookkeeping_does_not_write_a_part_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C lands just after a part's rename (in the directory's fsync), and a second time while
    the flush works out whether the part landed: the part is on disk once, and the flush on the way
    out writes nothing again."""
    writer = ResultsWriter(tmp_path, max_rows=1000, max_age_s=1000.0)
    writer.append_item(_arms("g1"))
    real_fsync, real_exists, fsyncs = os.fsync, Path.exists, []

    def ctrl_c_after_the_rename(fd: int) -> None:
        fsyncs.append(fd)
        if len(fsyncs) == 2:
            raise KeyboardInterrupt
        real_fsync(fd)

    def ctrl_c_while_looking(path: Path) -> bool:
        if path.suffix == ".parquet" and not path.name.startswith("."):
            raise KeyboardInterrupt
        return real_exists(path)

    monkeypatch.setattr(os, "fsync", ctrl_c_after_the_rename)
    monkeypatch.setattr(Path, "exists", ctrl_c_while_looking)
    with pytest.raises(KeyboardInterrupt):
        writer.flush()
    monkeypatch.setattr(os, "fsync", real_fsync)
    monkeypatch.setattr(Path, "exists", real_exists)
    writer.close()
    assert sorted(_raw(tmp_path)) == [(f"g1-arm{i}", 1) for i in range(4)]


def test_a_part_that_did_not_land_is_written_by_the_next_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = ResultsWriter(tmp_path, max_rows=1000, max_age_s=1000.0)
    writer.append_item(_arms("g1"))
    real_fsync = os.fsync

    def ctrl_c_before_the_rename(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", ctrl_c_before_the_rename)
    with pytest.raises(KeyboardInterrupt):
        writer.flush()
    assert writer.buffered == 4 and not part_files(tmp_path)
    monkeypatch.setattr(os, "fsync", real_fsync)
    writer.close()
    assert sorted(_raw(tmp_path)) == [(f"g1-arm{i}", 1) for i in range(4)]


def _dataset(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    writer = ResultsWriter(root)
    for i in range(3):
        record = _record("r1", f"i{i}", median=10.0 + i)
        stats = {"p20_us": 9.0 + i, "p80_us": 11.0 + i, "rel_noise": 0.01, "num_samples": 10}
        writer.append(replace(record, config_key=f'{{"c":{i}}}', is_default=i == 0, **stats))
        writer.flush()
    save_run(root, RunInfo("r1", "n", "t", "s.toml", "", "finished", 3, 0.0, 0.0))
    return root


def _damage(root: Path) -> list[Path]:
    """A truncated part, an empty one and one of another schema, as a user reported them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = part_files(root)
    truncated = parts[0]
    truncated.write_bytes(truncated.read_bytes()[:500])
    empty = parts[0].parent / "part-empty.parquet"
    empty.write_bytes(b"")
    foreign = root / "task=t" / "run_id=r1" / "part-foreign.parquet"
    pq.write_table(pa.table({"x": [1, 2], "y": ["a", "b"]}), foreign)
    return [truncated, empty, foreign]


def test_damaged_empty_and_foreign_parts_are_skipped_with_one_warning_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = _dataset(tmp_path)
    bad = _damage(root)
    with caplog.at_level(logging.WARNING, logger="tunectl.store.results"):
        rows = read_results(root)
        read_results(root)  # a second read in one process does not warn again
    assert sorted(r.item_id for r in rows) == ["i1", "i2"]
    warned = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(warned) == 3 and all(any(str(p) in w for w in warned) for p in bad)
    assert {str(b.path) for b in check_parts(root)} == set(map(str, bad))


@pytest.mark.parametrize("command", [["runs"], ["failures"], ["runs", "--json"]])
def test_read_commands_go_on_past_a_damaged_part(tmp_path: Path, command: list[str]) -> None:
    root = _dataset(tmp_path)
    _damage(root)
    out = CliRunner().invoke(app, [*command, "--results", str(root)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert out.exception is None, "no traceback"
    assert out.output.count("warning: skipped") == 3, "one line per damaged file"


@pytest.mark.parametrize("command", [["winners"], ["winners", "--json"]])
def test_winners_go_on_past_damaged_parts_with_one_line_per_run(tmp_path: Path, command: list[str]) -> None:
    root = _dataset(tmp_path)
    _damage(root)
    out = CliRunner().invoke(app, [*command, "--results", str(root)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert out.exception is None, "no traceback"
    assert out.stderr.count("warning: run r1 has 3 unreadable results file(s)") == 1, out.stderr


def test_doctor_lists_damaged_files_and_quarantines_them_without_deleting(tmp_path: Path) -> None:
    root = _dataset(tmp_path)
    bad = _damage(root)
    (root / "_runs" / "r2.json").write_text("{not json")
    listed = CliRunner().invoke(app, ["doctor", "--results", str(root)])
    assert listed.exit_code == 1
    assert listed.output.count("damaged: ") == 4 and "r2.json" in listed.output
    assert all(p.exists() for p in bad), "listing moves nothing"

    moved = CliRunner().invoke(app, ["doctor", "--results", str(root), "--quarantine"])
    assert moved.exit_code == 0, moved.output
    assert not any(p.exists() for p in bad)
    kept = sorted(p.name for p in (root / "_quarantine").rglob("*") if p.is_file())
    assert kept == sorted([*(p.name for p in bad), "r2.json"])
    assert CliRunner().invoke(app, ["doctor", "--results", str(root)]).exit_code == 0
    assert sorted(r.item_id for r in read_results(root)) == ["i1", "i2"]


def test_unknown_results_directories_and_run_ids_are_errors(tmp_path: Path) -> None:
    root = _dataset(tmp_path)
    typo = str(tmp_path / "typo")
    for args in (
        ["runs", "--results", typo], ["winners", "--results", typo], ["doctor", "--results", typo],
        ["winners", "--results", str(root), "--run", "typo"],
        ["failures", "--results", str(root), "--run", "typo"],
    ):  # fmt: skip
        out = CliRunner().invoke(app, args)
        assert out.exit_code == 2, (args, out.output)
        assert out.output.startswith("error: ") and len(out.output.strip().splitlines()) == 1
