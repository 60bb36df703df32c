"""Looks not taken, on a local Ray instance: a config far behind at the points near a point gets a
``dominated`` row there instead of a look, written by the driver, and the run ends with one row per
planned item, stopped and resumed or not; ``tunectl failures`` does not list them, and export chooses
as before."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.integration.test_faults import raw_row_count
from tests.integration.test_faults_driver import _InterruptedAt
from tunectl.cli import app
from tunectl.core.record import Phase, Status
from tunectl.orchestrator.submit import RunStopped, submit
from tunectl.runtime import load_bundle
from tunectl.store.results import read_results
from tunectl.store.runs import load_run

pytestmark = pytest.mark.slow

# 41 batch sizes 1 apart (each point's neighbours within twice its size), three configs of constant
# cost: the default (1 ms), one twice as fast and one three times slower. The cost model's times are
# simulated, so the rule sees the same ratios every run.
SPEC = """
name = "d"
task = "cost_model"
[static]
capacity = 1000000
[shapes.batch]
values = [{batches}]
[shapes.kv_len]
values = [1024]
[[configs]]
fixed_ms = 0.5
[[configs]]
fixed_ms = 3.0
[measure]
max_seconds = 0.02
[search]
strategy = "halving"
"""


def test_far_behind_looks_are_recorded_dominated_and_nothing_is_lost(
    ray_two_gpus: None, tmp_path: Path
) -> None:
    spec, results, store = tmp_path / "d.toml", tmp_path / "res", tmp_path / "b"
    spec.write_text(SPEC.format(batches=", ".join(str(b) for b in range(8, 49))))
    run_id = submit(str(spec), results).run_id
    rows = list(read_results(results, [run_id]))
    assert len(rows) == len({r.item_id for r in rows})  # one row per item
    info = load_run(results, run_id)
    assert info.state == "finished"
    dominated = [r for r in rows if r.status == Status.DOMINATED]
    assert dominated, "later points find the slow config 6x behind at the points before them"
    assert all(dict(r.config)["fixed_ms"] == 3.0 for r in dominated)
    assert all(
        r.phase == Phase.SCREEN and r.rung == 0 and "not looked at: at batch=" in r.message for r in dominated
    )
    assert all(r.device_name == "" for r in dominated)  # settled by the driver: no worker measured them
    first_looks = {r.shape for r in rows if r.phase == Phase.SCREEN and r.rung == 0}
    assert len(first_looks) == 41  # every point still had its first looks

    runner = CliRunner()
    out = runner.invoke(app, ["failures", "--results", str(results), "--run", run_id])
    assert out.exit_code == 0 and "dominated" not in out.output, out.output
    export = [
        "export",
        "bundle",
        "--results",
        str(results),
        "--name",
        "d",
        "--version",
        "1",
        "--out",
        str(store),
    ]
    assert runner.invoke(app, export).exit_code == 0
    entries = list(load_bundle(store / "d" / "1").entries("cost_model"))
    assert len(entries) == 41 and all(dict(e.config)["fixed_ms"] == 0.5 for e in entries)


def test_a_run_stopped_among_dominated_rows_resumes_to_one_row_per_item(
    ray_two_gpus: None, tmp_path: Path
) -> None:
    spec, results = tmp_path / "d.toml", tmp_path / "res"
    spec.write_text(SPEC.format(batches=", ".join(str(b) for b in range(8, 49))))
    with pytest.raises(RunStopped) as stopped:
        submit(str(spec), results, progress=_InterruptedAt(60))
    run_id = stopped.value.run_id
    before = raw_row_count(results, run_id)
    submit(None, results, resume=run_id)
    rows = list(read_results(results, [run_id]))
    assert 60 <= before < len(rows)  # stopped part way
    assert raw_row_count(results, run_id) == len(rows) == len({r.item_id for r in rows})  # none twice
    assert load_run(results, run_id).state == "finished"
    assert any(r.status == Status.DOMINATED for r in rows)
    assert {r.shape for r in rows if r.phase == Phase.FINAL} == {r.shape for r in rows}  # every point ended
