"""Held-out validation on a local Ray instance: the whole path (submit with refinement -> export ->
validate --holdout), and a stopped holdout run finished by resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.integration.test_faults import raw_row_count
from tests.integration.test_faults_driver import _InterruptedAt
from tests.unit.test_holdout import RANGED_KV
from tests.unit.test_refine import SPEC
from tunectl import api
from tunectl.cli import app
from tunectl.core.errors import UserError
from tunectl.orchestrator.submit import RunStopped, submit
from tunectl.store.results import read_results
from tunectl.store.runs import load_run

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_refine_export_and_validate_on_held_out_shapes(ray_two_gpus: None, tmp_path: Path) -> None:
    runner = CliRunner()
    spec, results, store = ROOT / "configs" / "refine_example.toml", tmp_path / "res", tmp_path / "b"
    out = runner.invoke(app, ["submit", str(spec), "--results", str(results)])
    assert out.exit_code == 0, out.output
    tuned = {r.shape_key for r in read_results(results)}
    # 5 starting points the task can run (64 x 8192 is over capacity), then refined ones
    assert len(tuned) > 5
    [run] = json.loads(runner.invoke(app, ["runs", "--results", str(results), "--json"]).output)
    assert run["num_planned"] >= run["num_done"] == len(read_results(results))  # refined items counted too
    out = runner.invoke(app, ["export", "bundle", "--results", str(results), "--name", "r", "--version", "1",
                              "--out", str(store), "--strict"])  # fmt: skip
    assert out.exit_code == 0, out.output
    args = ["validate", str(store / "r" / "1"), "--spec", str(spec), "--holdout", "3", "--seed", "1"]
    out = runner.invoke(app, [*args, "--results", str(results), "--rounds", "3"])
    assert out.exit_code in (0, 1), out.output  # 1 only if the pick lost at more than 5 % of shapes
    assert "pick / oracle over" in out.output and "geomean" in out.output
    held = [r for r in read_results(results) if r.phase == "holdout"]
    assert len({r.run_id for r in held}) == 1 and held[0].run_id not in {
        r.run_id for r in read_results(results) if r.phase != "holdout"
    }
    assert len({r.shape_key for r in held}) <= 3 and not {r.shape_key for r in held} & tuned
    assert len(held) == len({r.item_id for r in held})  # one row per arm
    assert all(r.status == "ok" for r in held)


def test_a_stopped_holdout_run_is_finished_by_resume_with_one_row_per_arm(
    ray_two_gpus: None, tmp_path: Path
) -> None:
    spec = tmp_path / "r.toml"
    spec.write_text(SPEC.replace('[shapes.kv_len]\nvalues = [1024]\nbucket = "ceil"', RANGED_KV))
    results, store = tmp_path / "res", tmp_path / "b"
    submit(str(spec), results)
    out = CliRunner().invoke(app, ["export", "bundle", "--results", str(results), "--name", "r", "--version",
                                   "1", "--out", str(store)])  # fmt: skip
    assert out.exit_code == 0, out.output
    bundle = store / "r" / "1"

    def holdout(seed: int, resume: str | None = None, progress: Any = None) -> api.HoldoutRun:
        options = api.HoldoutOptions(num_shapes=3, seed=seed, rounds=3, resume=resume)
        return api.holdout(api.read_bundle(bundle), api.load_spec(spec), results, options, progress)

    with pytest.raises(RunStopped) as stopped:
        holdout(seed=1, progress=_InterruptedAt(2))
    run_id = stopped.value.run_id
    planned = load_run(results, run_id).num_planned
    assert 2 <= raw_row_count(results, run_id) < planned
    with pytest.raises(UserError, match="planned other items"):
        holdout(seed=2, resume=run_id)

    done = holdout(seed=1, resume=run_id)
    assert done.run_id == run_id and load_run(results, run_id).state == "finished"
    rows = read_results(results, [run_id])
    assert raw_row_count(results, run_id) == len({r.item_id for r in rows}) == planned
    again = holdout(seed=1, resume=run_id)  # finished: its verdict is read, nothing measured
    assert raw_row_count(results, run_id) == planned
    assert again.holdout.ratios == done.holdout.ratios and done.holdout.ratios
