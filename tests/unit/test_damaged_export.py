"""A results file that cannot be read never changes a bundle silently: export refuses it in one line,
--skip-damaged publishes without its rows with every entry that lost rows saying so, and `winners`
marks those points."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import TINY_SPEC
from tests.finished_run import RUN, damage, finished_run, part_of
from tunectl.cli import app
from tunectl.core.keys import key_from_text
from tunectl.core.record import Phase, Record
from tunectl.runtime import load_bundle
from tunectl.store.results import read_dataset

BATCH_1 = '{"batch":1,"kv_len":64}'


def _finals_at_batch_1(row: Record) -> bool:
    return row.phase is Phase.FINAL and row.shape_key == BATCH_1


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A finished run whose finals at batch 1, kv_len 64 are in a part cut to half its size."""
    root = finished_run(tmp_path / "results", TINY_SPEC)
    damage(part_of(root, _finals_at_batch_1))
    return root


def run(*args: str) -> object:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def test_a_read_returns_the_unreadable_parts_as_data_without_warning(
    results: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        dataset = read_dataset(results)
    [part] = dataset.damaged
    assert part.run_id == RUN and part.task == "decode_attention" and "Parquet" in part.why
    assert dataset.damaged_runs == (RUN,)
    assert not caplog.records, "a read that returns the damage says nothing itself"


def export(results: Path, out: Path, *extra: str) -> object:
    """``tunectl export bundle`` of ``results`` as bundle b/1 into ``out``."""
    args = ["--results", str(results), "--name", "b", "--version", "1", "--out", str(out), *extra]
    return run("export", "bundle", *args)


def test_export_refuses_a_run_with_an_unreadable_part_in_one_line(results: Path, tmp_path: Path) -> None:
    out = export(results, tmp_path / "bundles")
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit), "a clean exit, no traceback"
    lines = out.output.strip().splitlines()
    assert len(lines) == 1, out.output
    [bad] = read_dataset(results).damaged
    assert str(bad.path) in lines[0] and "tunectl doctor" in lines[0] and "--skip-damaged" in lines[0]
    assert not (tmp_path / "bundles").exists() or not any((tmp_path / "bundles").rglob("manifest.json"))


def test_with_skip_damaged_each_entry_that_lost_rows_says_so_in_its_reason(
    results: Path, tmp_path: Path
) -> None:
    out = export(results, tmp_path / "bundles", "--skip-damaged")
    assert out.exit_code == 0, out.output
    bundle = load_bundle(tmp_path / "bundles" / "b" / "1", env_policy="off")
    static = dict(key_from_text(read_dataset(results).records[0].static_key))
    entries = {
        (batch, kv_len): bundle.entry("decode_attention", **static, batch=batch, kv_len=kv_len)
        for batch in (1, 2, 4)
        for kv_len in (64, 128)
    }
    reasons = {shape: entry.reason for shape, entry in entries.items() if entry is not None}
    assert len(reasons) == len(entries)
    lost = {shape for shape, reason in reasons.items() if f"run {RUN} lost rows here" in reason}
    assert lost == {(1, 64)}, reasons
    assert f"run {RUN}: left out 1 unreadable part(s)" in out.output and "1 entry" in out.output


def test_winners_marks_the_points_that_lost_rows_and_names_the_file(results: Path) -> None:
    out = run("winners", "--results", str(results))
    assert out.exit_code == 0, out.output
    [bad] = read_dataset(results).damaged
    assert f"warning: run {RUN} has 1 unreadable results file(s) ({bad.path})" in out.output
    rows = [ln for ln in out.output.splitlines() if "batch=" in ln]
    marked = [ln for ln in rows if ln.rstrip(" │").endswith("x")]
    assert len(marked) == 1 and "batch=1 kv_len=64" in marked[0], out.output
    assert "x rows lost to an unreadable results file" in out.output


def test_winners_json_says_which_points_lost_rows(results: Path) -> None:
    out = CliRunner().invoke(app, ["winners", "--results", str(results), "--json"])
    winners = json.loads(out.stdout)
    lost = [w["shape"] for w in winners if "lost" in w["flags"]]
    assert lost == [{"batch": 1, "kv_len": 64}]
    assert all(w["lost"] == [{"run_id": RUN, "certain": True}] for w in winners if "lost" in w["flags"])
