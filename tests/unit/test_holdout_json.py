"""The held-out results writer (benchmarks/studies/holdout_json.py) on a small results directory."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

from benchmarks.studies import holdout_json
from tests.finished_run import answer, finished_run
from tests.unit.test_rules import _spec, wave_time
from tunectl.api.checks import measured_shapes
from tunectl.core.registry import get_task
from tunectl.core.spec import parse_spec
from tunectl.decide.holdout import draw_shapes, plan_holdout
from tunectl.formats.export import export_bundle
from tunectl.store.results import ResultsWriter
from tunectl.store.runs import RunInfo, save_run
from tunectl.store.stores import read_bundle

SPEC = (
    _spec(probes=2)
    + '\n[baselines]\n"always 16 splits" = { num_splits = 16, gqa = "grouped", gather = "index" }\n'
)


def _holdout_run(results: Path, bundle: str, seed: int, measured: set[Any]) -> str:
    """A holdout run of 6 shapes at ``seed`` (none of ``measured``), answered by the simulated device;
    its id."""
    spec = parse_spec(SPEC, "waves.toml", "waves")
    run_id = f"r20261210-00000{seed}-abcdef"
    loaded = read_bundle(bundle)
    shapes = draw_shapes(spec, 6, seed, measured)
    items, _, _ = plan_holdout(spec, loaded, shapes, rounds=2, task=get_task(spec.task))
    writer, clock, rows = ResultsWriter(results), itertools.count(1), 0
    for item in items:
        found = answer(item, clock, lambda r: dataclasses.replace(r, run_id=run_id), wave_time)
        writer.append_item(found)
        rows += len(found)
    writer.close()
    save_run(results, RunInfo(run_id, "waves", spec.task, "waves.toml", SPEC, "finished", rows, 0.0, 1.0,
                              kind="holdout"))  # fmt: skip
    return run_id


def test_the_writer_pools_seeds_per_page_and_reports_the_baselines(tmp_path: Path) -> None:
    results = finished_run(tmp_path / "results", SPEC, oracle=wave_time, rows_per_part=256)
    bundle = export_bundle(results, "waves", "1", tmp_path / "bundles").location
    args = [
        "--results",
        str(results),
        "--json",
        str(tmp_path / "h.json"),
        "--markdown",
        str(tmp_path / "h.md"),
    ]
    measured = measured_shapes(results, read_bundle(bundle), parse_spec(SPEC, "waves.toml", "waves").task)
    for seed in (11, 12, 13):
        args += ["--holdout", f"8:{seed}={bundle}:{_holdout_run(results, bundle, seed, measured)}"]
    holdout_json.main(args)
    doc = json.loads((tmp_path / "h.json").read_text())
    page = doc["page"]["8"]
    assert page["seeds"] == [11, 12, 13] and page["shapes"] == 18
    assert 1.0 <= page["geomean"] <= page["worst"] and 0.0 <= page["within_3pct"] <= 1.0
    assert {"the default", "always 16 splits", "best single config"} <= set(doc["baselines"])
    assert doc["baselines"]["always 16 splits"]["8"]["geomean"] > page["geomean"]
    text = (tmp_path / "h.md").read_text()
    assert text.index("## Findings") < text.index("| choosing by") < text.index("## Commands")


def test_a_holdout_times_the_bundles_candidates_so_a_confirmed_pick_can_be_scored(tmp_path: Path) -> None:
    from tunectl.core.plan import full_config

    results = finished_run(tmp_path / "results", SPEC, oracle=wave_time, rows_per_part=256)
    bundle = read_bundle(export_bundle(results, "waves", "1", tmp_path / "bundles").location)
    spec = parse_spec(SPEC, "waves.toml", "waves")
    task = get_task(spec.task)
    shapes = draw_shapes(spec, 6, 21, measured_shapes(results, bundle, spec.task))
    items, _, _ = plan_holdout(spec, bundle, shapes, rounds=2, task=task)
    listed = 0
    for item in items:
        cands = bundle.candidates(spec.task, **dict(item.static), **dict(item.shape))
        listed += len(cands)
        assert {full_config(task, c) for c in cands} <= set(item.arms)
    assert listed > len(items), "the bundle lists more than its pick somewhere"
