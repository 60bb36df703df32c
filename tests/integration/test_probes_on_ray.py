"""Probes on a local Ray instance through the command line and the library: probe then export, a
stopped probe run finished by resume, and a tuning run with probes in its spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.integration.test_faults import raw_row_count
from tests.integration.test_faults_driver import _InterruptedAt
from tests.unit.test_probes import ALIGNED, FITS, STEADY
from tests.unit.test_refine import _spec
from tunectl import api
from tunectl.cli import app
from tunectl.core.errors import UserError
from tunectl.core.keys import make_key
from tunectl.core.record import Phase
from tunectl.decide.holdout import draw_shapes
from tunectl.measure.rounds import RACE_AFTER
from tunectl.orchestrator.submit import RunStopped, submit
from tunectl.runtime import load_bundle
from tunectl.store.results import read_results
from tunectl.store.runs import load_run

pytestmark = pytest.mark.slow

# On a local instance: shorter measurements, no refinement (the grid's points and the probes only), and
# 8 interleaved rounds.
ON_RAY = ALIGNED.replace("max_seconds = 0.1", "max_seconds = 0.05")
ON_RAY += "[search]\nrefine_budget = 0\nrounds = 8\n"


def test_probe_then_export_on_a_local_instance(ray_two_gpus: None, tmp_path: Path) -> None:
    spec, results, store = tmp_path / "p.toml", tmp_path / "res", tmp_path / "b"
    spec.write_text(ON_RAY)
    runner = CliRunner()
    out = runner.invoke(app, ["submit", str(spec), "--results", str(results)])
    assert out.exit_code == 0, out.output
    [tune] = {r.run_id for r in read_results(results)}
    export = ["export", "bundle", "--results", str(results), "--version", "1", "--out", str(store)]
    assert runner.invoke(app, [*export, "--name", "before"]).exit_code == 0

    out = runner.invoke(app, ["probe", tune, "--results", str(results)])
    assert out.exit_code == 0, out.output
    assert "8 shape(s) in 4 cell(s)" in out.output
    rows = [r for r in read_results(results) if r.phase == Phase.PROBE]
    assert len({r.run_id for r in rows}) == 1 and len(rows) == len({r.item_id for r in rows}) == 8 * 3
    out = runner.invoke(app, [*export, "--name", "after"])
    assert out.exit_code == 0, out.output
    assert "4 entries from 2 run(s)" in out.output and "chosen over their regions by probes" in out.output
    # held-out shapes leave out the probes' shapes as well as the tuned points (batch 1-64, one length)
    measured = api.checks.measured_shapes(results, load_bundle(store / "after" / "1"), "cost_model")
    tuned = {make_key({"batch": b, "kv_len": 1024}) for b in (8, 16, 32, 64)}
    assert {r.shape for r in rows} | tuned == measured
    drawn = draw_shapes(_spec("", ON_RAY), 64, seed=0, tuned=measured)
    assert len(drawn) == 64 - len(measured) and not set(drawn) & measured
    # without probes each tuned point keeps its own winner (the cost model's times are simulated: no
    # noise a busy CPU adds to a sleep)
    before = list(load_bundle(store / "before" / "1").entries("cost_model"))
    assert len(before) == 4 and all(make_key(dict(e.config)) == FITS for e in before), before
    _chose_the_steady_kernel(store / "after" / "1")
    manifest = json.loads((store / "after" / "1" / "manifest.json").read_text())
    assert sorted(manifest["source_runs"]) == sorted({tune, rows[0].run_id})


def test_a_stopped_probe_run_is_finished_by_resume_with_one_row_per_arm(
    ray_two_gpus: None, tmp_path: Path
) -> None:
    spec, results = tmp_path / "p.toml", tmp_path / "res"
    spec.write_text(ON_RAY)
    tune = submit(str(spec), results).run_id
    with pytest.raises(RunStopped) as stopped:
        api.probe(results, tune, api.ProbeOptions(rounds=3), _InterruptedAt(2))
    run_id = stopped.value.run_id
    planned = load_run(results, run_id).num_planned
    assert load_run(results, run_id).kind == "probe" and 2 <= raw_row_count(results, run_id) < planned
    with pytest.raises(UserError, match="planned other items"):
        api.probe(results, tune, api.ProbeOptions(rounds=3, per_cell=3, resume=run_id))
    done = api.probe(results, tune, api.ProbeOptions(rounds=3, resume=run_id))
    assert done.run_id == run_id and load_run(results, run_id).state == "finished"
    assert (
        raw_row_count(results, run_id) == len({r.item_id for r in read_results(results, [run_id])}) == planned
    )


def test_a_tuning_run_with_probes_in_its_spec_on_a_local_instance(ray_two_gpus: None, tmp_path: Path) -> None:
    spec, results, store = tmp_path / "p.toml", tmp_path / "res", tmp_path / "b"
    spec.write_text(ON_RAY + "probes = 2\n")
    out = CliRunner().invoke(app, ["submit", str(spec), "--results", str(results)])
    assert out.exit_code == 0, out.output
    assert "8 probe shape(s) were measured inside" in " ".join(out.output.split())
    rows = read_results(results)
    assert len({r.run_id for r in rows}) == 1 and len(rows) == len({r.item_id for r in rows})
    assert sum(r.phase == Phase.PROBE for r in rows) == 8 * 3
    raced = [r for r in rows if r.rounds]  # the default in every round; an arm far behind retired early
    assert all(r.rounds == 8 or (not r.is_default and r.rounds == RACE_AFTER) for r in raced)
    out = CliRunner().invoke(app, ["export", "bundle", "--results", str(results), "--name", "p", "--version",
                                   "1", "--out", str(store)])  # fmt: skip
    assert out.exit_code == 0 and "chosen over their regions by probes" in out.output, out.output
    _chose_the_steady_kernel(store / "p" / "1")


def _chose_the_steady_kernel(bundle: Path) -> None:
    """The probes chose every cell's entry over its region, and each serves the steady kernel."""
    entries = list(load_bundle(bundle).entries("cost_model"))
    regional = [e for e in entries if e.basis == "region"]
    assert len(regional) == len(entries) == 4, entries
    assert all(make_key(dict(e.config)) == STEADY for e in regional), entries
    assert all("least worst loss over the region" in e.reason for e in regional)
