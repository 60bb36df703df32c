"""Stacked validation of bundles end to end on a local Ray instance: a slower bundle is reported, a
faster one is published and a slower one refused."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.unit.test_validate import DEFAULT, SLOW, SPEC
from tunectl.cli import app
from tunectl.core.keys import key_text
from tunectl.core.record import Record
from tunectl.decide.stacked import read_validation
from tunectl.runtime import Entry
from tunectl.store.bundle import TaskTable, build_files, publish_local
from tunectl.store.results import ResultsWriter, read_results
from tunectl.store.runs import RunInfo, save_run

pytestmark = pytest.mark.slow


def _publish(store: Path, config: dict[str, Any]) -> Path:
    entry = Entry.from_json({"static": {}, "shape": {"n": 4}, "config": config, "median_us": 1.0})
    table = TaskTable("fault_injection", (), {"n": {"policy": "exact", "points": [4]}}, (entry,))
    return publish_local(store, "fi", "1", build_files("fi", "1", [table], ["hand"], {}))


def test_validate_reports_a_slower_bundle_and_exits_1(ray_two_gpus: None, tmp_path: Path) -> None:
    bundle = _publish(tmp_path / "bundles", {"fault": "none", "run_ms": 1})
    spec = tmp_path / "v.toml"
    spec.write_text(SPEC)
    results = tmp_path / "results"
    args = ["validate", str(bundle), "--spec", str(spec), "--layers", "2", "--rounds", "3"]
    out = CliRunner().invoke(app, [*args, "--results", str(results)])
    assert out.exit_code == 1, out.output
    assert "slower" in out.output and "geometric mean" in out.output and "Traceback" not in out.output
    rows = read_results(results)
    assert {r.phase for r in rows} == {"validate"} and len(rows) == 2
    validation = read_validation(rows)
    [point] = validation.points
    assert point.verdict == "slower" and validation.losers == [point] and validation.layers == 2


TWO_POINTS = """
name = "gqa"
task = "decode_attention"
[static]
dtype = "float32"
num_q_heads = 16
num_kv_heads = 2
head_dim = 64
page_size = 16
[shapes.batch]
values = [16]
[shapes.kv_len]
values = [1024]
[configs]
gqa = ["grouped"]
[measure]
warmup = 1
min_samples = 3
max_seconds = 0.3
[search]
rounds = 3
"""


def test_export_validate_publishes_a_faster_bundle_and_refuses_a_slower_one(
    ray_two_gpus: None, tmp_path: Path
) -> None:
    runner = CliRunner()
    spec, results, store = tmp_path / "gqa.toml", tmp_path / "results", tmp_path / "bundles"
    spec.write_text(textwrap.dedent(TWO_POINTS))
    out = runner.invoke(app, ["submit", str(spec), "--results", str(results)])
    assert out.exit_code == 0, out.output
    export = [
        "export",
        "bundle",
        "--results",
        str(results),
        "--out",
        str(store),
        "--validate",
        "--layers",
        "2",
    ]
    out = runner.invoke(app, [*export, "--name", "good", "--version", "1", "--rounds", "3"])
    assert out.exit_code == 0, out.output
    assert (
        "validated and published good/1" in out.output and (store / "good" / "1" / "manifest.json").exists()
    )

    # Results that misjudged a slow config as the winner (as noise could): validation catches it.
    bad = tmp_path / "bad"
    fi_spec = SPEC.replace("[1, 2, 4]", "[4]")
    save_run(bad, RunInfo("rbad", "v", "fault_injection", "v.toml", fi_spec, "finished", 2, 1.0, 1.0))
    writer = ResultsWriter(bad)
    for config, default, speedup in ((DEFAULT, True, 1.0), (SLOW, False, 2.0)):
        writer.append(
            Record(
                run_id="rbad", item_id=key_text(config), task="fault_injection", static_key="{}",
                shape_key='{"n":4}', config_key=key_text(config),
                is_default=default, status="ok", median_us=10.0 / speedup, p20_us=10.0 / speedup,
                p80_us=10.0 / speedup, rel_noise=0.0, num_samples=10, phase="final", group_id="g", rounds=8,
                speedup=speedup, speedup_lo=speedup, speedup_hi=speedup, device_name="cpu", finished_at=2.0,
            )
        )  # fmt: skip
    writer.close()
    out = runner.invoke(
        app, ["export", "bundle", "--results", str(bad), "--out", str(store), "--validate", "--layers", "2",
              "--name", "bad", "--version", "1", "--rounds", "3"],
    )  # fmt: skip
    assert out.exit_code == 1, out.output
    assert "not published" in out.output and "slower than the defaults" in out.output
    assert not (store / "bad").exists(), "a refused bundle leaves nothing in the store"
    assert {r.phase for r in read_results(bad, run_ids=None) if r.run_id != "rbad"} == {"validate"}
