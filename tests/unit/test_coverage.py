"""Export after refinement: refined points become entries, every cell maps to one, the margin holds.

Results come from the simulated device of tests/unit/test_refine.py (true times of the cost model task),
written to a results directory as a run would write them; export and lookup are the real ones.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from typer.testing import CliRunner

from tests.unit.test_refine import SPEC, _spec, _winner, drive, work_of
from tunectl.cli import app
from tunectl.core.keys import Key, make_key
from tunectl.core.plan import plan
from tunectl.core.record import Record
from tunectl.decide.coverage import cover, nearest, source_for
from tunectl.decide.select import Winner, select_winners
from tunectl.runtime import load_bundle
from tunectl.store.results import ResultsWriter
from tunectl.store.runs import RunInfo, save_run
from tunectl.tasks.cost_model import CostModel

PER_BATCH = {"fixed_ms": 0.0, "per_batch_ms": 0.05, "per_kv_ms": 0.0}
DEFAULT = {"fixed_ms": 1.0, "per_batch_ms": 0.0, "per_kv_ms": 0.0}
TWO_KV = SPEC.replace(
    '[shapes.kv_len]\nvalues = [1024]\nbucket = "ceil"',
    '[shapes.kv_len]\nrange = [1024, 4096]\nvalues = [1024, 4096]\nstep = 512\nbucket = "ceil"',
)


def write_run(root: Path, spec_text: str, run_id: str = "r1", **stop: int) -> list[Record]:
    """Run ``spec_text`` on the simulated device and write its records and metadata under ``root``."""
    spec = _spec("", spec_text)
    records = drive(work_of(spec), **stop)
    now = time.time()
    writer = ResultsWriter(root)
    for r in records:
        writer.append_item([dataclasses.replace(r, run_id=run_id, finished_at=now)])
    writer.close()
    info = RunInfo(run_id, spec.name, spec.task, "r.toml", spec_text, "finished", len(records), now, now)
    save_run(root, dataclasses.replace(info, facts=plan(spec, CostModel()).facts))
    return records


def export(root: Path, store: Path, *extra: str) -> tuple[int, str]:
    args = ["export", "bundle", "--results", str(root), "--name", "r", "--version", "1", "--out", str(store)]
    out = CliRunner().invoke(app, [*args, *extra])
    return out.exit_code, out.output


def test_refined_points_are_entries_and_lookup_uses_them(tmp_path: Path) -> None:
    write_run(tmp_path / "res", SPEC)
    code, output = export(tmp_path / "res", tmp_path / "b")
    assert code == 0, output
    bundle = load_bundle(tmp_path / "b" / "r" / "1")
    points = bundle.task_info("cost_model")["shape_params"]["batch"]["points"]
    assert len(points) > 3 and {1, 8, 64} <= set(points)
    static = {"capacity": 1000000}
    # Batch 12: the starting grid's ceil bucket (64) would pick the default; per-batch is 1.7x faster.
    assert bundle.lookup("cost_model", **static, batch=12, kv_len=1000) == PER_BATCH
    assert bundle.lookup("cost_model", **static, batch=40, kv_len=1000) == DEFAULT


def test_cells_refined_at_another_kv_length_are_served_by_a_tuned_point(tmp_path: Path) -> None:
    write_run(tmp_path / "res", TWO_KV)
    code, output = export(tmp_path / "res", tmp_path / "b")
    assert code == 0, output
    assert "served by a tuned point beside them" in output and "no entry" not in output
    bundle = load_bundle(tmp_path / "b" / "r" / "1")
    info = bundle.task_info("cost_model")["shape_params"]
    static = {"capacity": 1000000}
    for batch in range(1, 65):
        for kv in (1024, 2000, 4096):
            assert bundle.lookup("cost_model", **static, batch=batch, kv_len=kv) is not None, (batch, kv)
    filled = [e for e in bundle.entries("cost_model") if e.served_by]
    assert filled and all("served by the tuned point" in e.reason for e in filled)
    assert len(list(bundle.entries("cost_model"))) == len(info["batch"]["points"]) * len(
        info["kv_len"]["points"]
    )


def test_without_filling_the_regions_that_answer_none_are_listed_and_strict_refuses(tmp_path: Path) -> None:
    write_run(tmp_path / "res", TWO_KV)
    code, output = export(tmp_path / "res", tmp_path / "b", "--no-fill")
    assert code == 0, output
    holes = [line for line in output.splitlines() if line.startswith("no entry:")]
    assert holes and all(": not measured" in line for line in holes)
    code, output = export(tmp_path / "res", tmp_path / "strict", "--no-fill", "--strict")
    assert code == 2 and "would answer None" in output
    assert not (tmp_path / "strict" / "r" / "1").exists()


def test_a_point_the_task_cannot_run_is_served_by_the_nearest_feasible_one(tmp_path: Path) -> None:
    text = TWO_KV.replace("capacity = 1000000", "capacity = 131072")  # 64 x 4096 does not fit
    write_run(tmp_path / "res", text)
    code, output = export(tmp_path / "res", tmp_path / "b", "--strict")
    assert code == 0, output
    bundle = load_bundle(tmp_path / "b" / "r" / "1")
    entry = bundle.entry("cost_model", capacity=131072, batch=64, kv_len=4096)
    assert entry is not None and entry.served_by is not None
    assert dict(entry.served_by)["batch"] * dict(entry.served_by)["kv_len"] <= 131072


def test_range_ends_the_policy_cannot_reach_are_listed() -> None:
    w = _winner(PER_BATCH, 8, 2.0)
    got = cover([w], policies={"cost_model": {"batch": "ceil"}}, ranges={"cost_model": {"batch": (1, 100)}})
    [hole] = got.holes
    assert hole.line() == "no entry: task cost_model, batch 9-100: above the largest tuned batch (ceil)"


def test_nearest_is_by_log_distance_ties_in_value_order() -> None:
    shapes = [
        make_key({"batch": 16, "kv": 1024}),
        make_key({"batch": 64, "kv": 1024}),
        make_key({"batch": 32, "kv": 8192}),
    ]
    assert nearest(make_key({"batch": 24, "kv": 1024}), shapes) == shapes[0]
    assert nearest(make_key({"batch": 32, "kv": 1024}), shapes[:2]) == shapes[0]


def _tuned(*points: tuple[dict[str, float], int, int]) -> dict[Key, Winner]:
    """Winners of ``config`` at (batch, kv) points, by shape."""
    winners = [
        dataclasses.replace(_winner(c, b, 1.5), shape=make_key({"batch": b, "kv": kv})) for c, b, kv in points
    ]
    return {w.shape: w for w in winners}


def test_a_cell_between_two_points_that_agree_is_served_by_them_not_by_a_nearer_diagonal() -> None:
    a, b, c = {"fixed_ms": 1.0}, {"per_batch_ms": 0.05}, {"per_kv_ms": 0.01}
    cell = make_key({"batch": 16, "kv": 2816})
    tuned = _tuned((a, 16, 1024), (a, 16, 8192), (b, 13, 2816), (c, 28, 2816))
    # (13, 2816) is nearest, but 16 x 1024 and 16 x 8192 agree: the segment between them is settled.
    assert nearest(cell, list(tuned)) == make_key({"batch": 13, "kv": 2816})
    assert source_for(cell, tuned) == make_key({"batch": 16, "kv": 1024})
    filled = {w.shape: w for w in cover(list(tuned.values()), policies={}, ranges={}).winners}
    assert filled[cell].served_by == make_key({"batch": 16, "kv": 1024}) and filled[cell].config == make_key(
        a
    )
    # Where no bracket agrees, a point on a line through the cell serves before a nearer diagonal one.
    tuned = _tuned((a, 16, 1024), (c, 16, 8192), (b, 14, 3072))
    assert nearest(cell, list(tuned)) == make_key({"batch": 14, "kv": 3072})
    assert source_for(cell, tuned) == make_key({"batch": 16, "kv": 1024})
    # With nothing on a line through it, the nearest of all.
    tuned = _tuned((a, 8, 1024), (b, 14, 3072))
    assert source_for(cell, tuned) == make_key({"batch": 14, "kv": 3072})


def test_a_cell_whose_corners_all_agree_is_served_by_them_not_by_a_far_point_on_its_line() -> None:
    a, b = {"fixed_ms": 1.0}, {"per_batch_ms": 0.05}
    cell = make_key({"batch": 30, "kv": 24576})
    # Batch 30 was measured at 4096 only (b won there); the four points around the cell agree on a.
    corners = [(a, 28, 16384), (a, 28, 32768), (a, 32, 16384), (a, 32, 32768)]
    tuned = _tuned((b, 30, 4096), *corners)
    assert source_for(cell, tuned) == make_key({"batch": 32, "kv": 32768})  # the nearest corner
    # In a bundle: 64 x 24576 (b) puts the cell's kv on the grid, a point on its line too but farther.
    grid = list(_tuned((b, 64, 24576)).values()) + list(tuned.values())
    filled = {w.shape: w for w in cover(grid, policies={}, ranges={}).winners}
    assert filled[cell].config == make_key(a)
    assert filled[cell].served_by == make_key({"batch": 32, "kv": 32768})
    # One corner disagreeing unsettles the box: the point on the cell's line serves again.
    tuned = _tuned((b, 30, 4096), *corners[:3], (b, 32, 32768))
    assert source_for(cell, tuned) == make_key({"batch": 30, "kv": 4096})
    # A corner with no point at all (nothing above batch 32) leaves no box either.
    cell = make_key({"batch": 40, "kv": 24576})
    tuned = _tuned((b, 40, 4096), *corners)
    assert source_for(cell, tuned) == make_key({"batch": 40, "kv": 4096})


def test_the_margin_keeps_the_default_unless_the_whole_interval_clears_it() -> None:
    def final(config: dict[str, float], lo: float, hi: float, default: bool) -> Record:
        config_key = json.dumps(config, sort_keys=True, separators=(",", ":"))
        speedup = {"speedup": (lo + hi) / 2, "speedup_lo": lo, "speedup_hi": hi}
        static, shape = '{"capacity":1}', '{"batch":1}'
        return Record("r", f"i{lo}{default}", "cost_model", static, shape, config_key, default, "ok",
                      median_us=1.0, phase="final", group_id="g", rounds=8, **speedup)  # fmt: skip

    near = [final(DEFAULT, 1.0, 1.0, True), final(PER_BATCH, 1.002, 1.005, False)]
    [kept] = select_winners(near)
    assert kept.is_default  # 1.002-1.005 does not clear 1.02
    [won] = select_winners(near, margin=0.0)
    assert not won.is_default
    clear = [final(DEFAULT, 1.0, 1.0, True), final(PER_BATCH, 1.03, 1.05, False)]
    [w] = select_winners(clear)
    assert not w.is_default


def test_margin_comes_from_the_spec_and_export_option_overrides_it(tmp_path: Path) -> None:
    text = SPEC.replace("per_batch_ms = 0.05", "per_batch_ms = 0.0485") + "[select]\nmargin = 0.05\n"
    write_run(
        tmp_path / "res", text
    )  # at batch 1 the per-batch config is 20x faster; near batch 20 only a bit
    code, output = export(tmp_path / "res", tmp_path / "b")
    assert code == 0, output
    loose = load_bundle(tmp_path / "b" / "r" / "1")
    code, output = export(tmp_path / "res", tmp_path / "b2", "--margin", "0")
    assert code == 0, output
    tight = load_bundle(tmp_path / "b2" / "r" / "1")
    default_wins = [sum(e.is_default for e in b.entries("cost_model")) for b in (loose, tight)]
    assert default_wins[0] > default_wins[1]
    code, output = export(tmp_path / "res", tmp_path / "b3", "--margin", "1.5")
    assert code == 2 and "--margin" in output and "Traceback" not in output
