"""Held-out validation: shapes drawn inside the ranges, pick / oracle per shape, the 5 % rule, and the
whole path on a local Ray instance (submit with refinement -> export -> validate --holdout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.integration.test_faults import raw_row_count
from tests.integration.test_faults_driver import _InterruptedAt
from tests.unit.test_refine import SPEC, _spec
from tunectl.cli import app
from tunectl.core.errors import UserError
from tunectl.core.keys import key_text, make_key
from tunectl.core.record import Record
from tunectl.decide.holdout import HeldOut, Holdout, draw_shapes, read_holdout
from tunectl.orchestrator.submit import RunStopped, submit
from tunectl.orchestrator.validate import HoldoutRun, validate_holdout
from tunectl.store.results import read_results
from tunectl.store.runs import load_run

ROOT = Path(__file__).resolve().parents[2]
RANGED_KV = '[shapes.kv_len]\nrange = [1024, 8192]\nvalues = [1024]\nstep = 512\nbucket = "ceil"'


def _ranged() -> object:
    return _spec("", SPEC.replace('[shapes.kv_len]\nvalues = [1024]\nbucket = "ceil"', RANGED_KV))


def test_held_out_shapes_lie_inside_the_ranges_on_the_step_and_were_not_tuned() -> None:
    spec = _ranged()
    tuned = [make_key({"batch": b, "kv_len": 1024}) for b in (1, 8, 64)]
    shapes = draw_shapes(spec, 30, seed=7, tuned=tuned)
    assert len(shapes) == len(set(shapes)) == 30 and not set(shapes) & set(tuned)
    for shape in map(dict, shapes):
        assert 1 <= shape["batch"] <= 64 and 1024 <= shape["kv_len"] <= 8192 and shape["kv_len"] % 512 == 0
    assert draw_shapes(spec, 30, seed=7, tuned=tuned) == shapes
    assert draw_shapes(spec, 30, seed=8, tuned=tuned) != shapes


def _arms(shape: dict[str, int], speedups: dict[str, float]) -> list[Record]:
    """A holdout comparison's records; ``speedups`` by config name, the first the default."""
    out = []
    for i, (name, s) in enumerate(speedups.items()):
        out.append(Record("h", f"{shape}{name}", "cost_model", '{"capacity":1}', key_text(make_key(shape)),
                          json.dumps({"c": name}), i == 0, "ok", median_us=100 / s, phase="holdout",
                          group_id=str(shape), rounds=8, speedup=s, speedup_lo=s * 0.99,
                          speedup_hi=s * 1.01))  # fmt: skip
    return out


def test_pick_over_oracle_per_shape_and_the_five_percent_rule() -> None:
    records, picks = [], {}
    for batch in range(1, 21):  # the pick is the best at 19 shapes, 10 % slower than the best at one
        shape = {"batch": batch, "kv_len": 1024}
        records += _arms(shape, {"d": 1.0, "a": 1.5, "b": 1.65 if batch == 20 else 1.2})
        picks[('{"capacity":1}', key_text(make_key(shape)))] = make_key({"c": "a"})
    held = read_holdout(records, picks, margin=0.02)
    assert len(held.shapes) == 20 and held.quantile(0.5) == 1.0
    assert held.ratios[-1] == pytest.approx(1.1) and [h.shape for h in held.losers] == [
        make_key({"batch": 20, "kv_len": 1024})
    ]
    assert not held.failed  # 1 of 20 is 5 %, not more
    assert Holdout(held.shapes[-2:], 0.02).failed  # 1 of 2 is
    assert held.geomean == pytest.approx(1.1 ** (1 / 20))


def test_a_failed_comparison_is_reported_not_counted() -> None:
    held = HeldOut(
        make_key({"capacity": 1}), make_key({"batch": 3}), make_key({"c": "a"}), None, None, "error"
    )
    assert not Holdout((held,)).failed and Holdout((held,)).ratios == []


@pytest.mark.slow
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


def test_holdout_on_a_spec_without_ranges_is_one_line_and_exit_2(tmp_path: Path) -> None:
    spec = ROOT / "configs" / "quickstart.toml"
    args = ["validate", str(tmp_path / "none"), "--spec", str(spec), "--holdout", "3"]
    out = CliRunner().invoke(app, [*args, "--results", str(tmp_path / "res")])
    assert out.exit_code == 2 and "declare range = [lo, hi]" in out.output and "Traceback" not in out.output
    assert not (tmp_path / "res").exists()


def test_a_holdout_where_no_comparison_succeeded_says_so_and_where_to_look() -> None:
    from types import SimpleNamespace

    from rich.console import Console

    from tunectl.cli.validate import print_holdout

    static, pick = make_key({"capacity": 1}), make_key({"c": "a"})
    shapes = tuple(
        HeldOut(static, make_key({"batch": b}), pick, None, None, status)
        for b, status in ((1, "crash"), (2, "crash"), (3, "error"))
    )
    console = Console(record=True, width=200)
    run = SimpleNamespace(holdout=Holdout(shapes), run_id="r1", spec="s.toml", skipped=[])
    print_holdout(console, run, Path("res"))
    text = console.export_text()
    assert "not compared: 2 crash, 1 error; `tunectl failures --run r1 --results res` lists why" in text
    assert "no held-out shape was measured" in text


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

    def holdout(**kw: Any) -> HoldoutRun:
        return validate_holdout(bundle, spec, results, num_shapes=3, rounds=3, **kw)

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


def test_the_table_says_a_shared_static_key_and_shape_parameter_once() -> None:
    from types import SimpleNamespace

    from rich.console import Console

    from tunectl.cli.validate import print_holdout

    def shown(*statics: dict[str, object]) -> list[str]:
        pick, oracle = make_key({"c": "a"}), make_key({"c": "b"})
        shapes = tuple(
            HeldOut(make_key(statics[i % len(statics)]), make_key({"batch": b, "q_len": 1}), pick, oracle, r)
            for i, (b, r) in enumerate(((3, 1.01), (9, 1.2), (21, 1.0)))
        )
        console = Console(record=True, width=120)
        run = SimpleNamespace(holdout=Holdout(shapes), run_id="r1", spec="s.toml", skipped=[])
        print_holdout(console, run, Path("res"))
        return console.export_text().splitlines()

    lines = shown({"page_size": 128, "dtype": "bfloat16"})
    rows = [line for line in lines if "batch=" in line]
    assert len(rows) == 3 and not any("page_size" in r or "q_len" in r for r in rows)
    assert sum("dtype=bfloat16 page_size=128" in line for line in lines) == 1
    assert any("every shape: q_len=1" in line for line in lines)
    two = shown({"page_size": 128}, {"page_size": 16})
    assert sum("page_size=" in line for line in two) == 3  # a static column, one per row
