"""Probes: shapes inside each cell's region, the short list compared there, and export choosing each
probed cell's config over its region; offline with the cost model's true times (on a local Ray
instance: tests/integration/test_probes_on_ray.py)."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.unit.test_refine import _spec, answer, drive, work_of
from tunectl.cli import app
from tunectl.core.buckets import make_bucketer
from tunectl.core.keys import key_dict, make_key
from tunectl.core.plan import plan
from tunectl.core.record import Phase, Record, Status
from tunectl.decide.inline_probes import probed
from tunectl.decide.probes import plan_probes, point_timings, probe_shapes, region, regional, spread
from tunectl.decide.refine import refined
from tunectl.decide.search import Search
from tunectl.decide.select import every_config, select_winners
from tunectl.tasks.cost_model import CostModel

# A kernel fast at batches that are multiples of 8 only (every tuned batch), slow between them; a
# steady one a little slower than it there; the default, slower than both.
ALIGNED = """
name = "p"
task = "cost_model"
[static]
capacity = 1000000
[shapes.batch]
range = [1, 64]
values = [8, 16, 32, 64]
bucket = "ceil"
[shapes.kv_len]
values = [1024]
bucket = "ceil"
[[configs]]
fixed_ms = 0.5
unaligned_ms = 2.0
align_batch = 8
[[configs]]
fixed_ms = 0.8
[measure]
max_seconds = 0.1
"""
FITS = make_key(
    {"align_batch": 8, "fixed_ms": 0.5, "per_batch_ms": 0.0, "per_kv_ms": 0.0, "unaligned_ms": 2.0}
)
STEADY = make_key({"fixed_ms": 0.8, "per_batch_ms": 0.0, "per_kv_ms": 0.0})
DEFAULT = make_key({"fixed_ms": 1.0, "per_batch_ms": 0.0, "per_kv_ms": 0.0})


def test_a_region_is_what_the_policy_maps_to_the_value_inside_the_span() -> None:
    ceil, floor = make_bucketer("ceil", [8, 16, 64]), make_bucketer("floor", [8, 16, 64])
    assert [region(ceil, v, (1, 64)) for v in (8, 16, 64)] == [(1, 8), (9, 16), (17, 64)]
    assert [region(floor, v, (1, 100)) for v in (8, 16, 64)] == [(8, 15), (16, 63), (64, 100)]
    nearest = make_bucketer("nearest", [8, 16, 64])
    lo, hi = region(nearest, 16, (1, 100))
    assert nearest(lo) == nearest(hi) == 16 and nearest(lo - 1) == 8 and nearest(hi + 1) == 64
    assert region(make_bucketer("exact", [8, 16]), 16, (1, 64)) == (16, 16)
    assert region(ceil, 128, (1, 64)) == (128, 128)  # a value outside the span is itself only


def test_probes_spread_over_the_region_in_log_size_on_the_step_one_per_slice() -> None:
    assert spread(9, 16, 1, 0.25) == 10 and spread(9, 16, 1, 0.75) == 14
    assert spread(6145, 8192, 128, 0.5) % 128 == 0 and 6145 <= spread(6145, 8192, 128, 0.5) <= 8192
    assert spread(8193, 8200, 512, 0.5) == 8200  # no multiple of the step inside: the region's top
    cell = make_key({"batch": 16, "kv_len": 8192})
    regions = {"batch": (9, 16), "kv_len": (4097, 8192)}
    shapes = probe_shapes(cell, regions, {"kv_len": 512}, 4)
    assert len(shapes) == 4 and cell not in shapes
    got = [key_dict(s) for s in shapes]
    assert all(9 <= s["batch"] <= 16 and 4097 <= s["kv_len"] <= 8192 and s["kv_len"] % 512 == 0 for s in got)
    # one per slice of each dimension, and the slices of kv_len run against batch's
    assert sorted(s["batch"] for s in got) == [s["batch"] for s in got]
    assert sorted((s["kv_len"] for s in got), reverse=True) == [s["kv_len"] for s in got]
    assert probe_shapes(make_key({"batch": 1}), {"batch": (1, 1)}, {}, 2) == []  # nothing to vary


def _grid(spec_text: str) -> list[Record]:
    return drive(work_of(_spec("", spec_text)))


def _plan(records: list[Record], per_cell: int = 2, shortlist: int = 4) -> Any:
    spec = _spec("", ALIGNED)
    task = CostModel()
    winners = select_winners(records)
    return plan_probes(
        "cost_model", spec.shapes, {d.name: functools.partial(make_bucketer, d.bucket) for d in spec.shapes},
        winners, point_timings(records, every_config), lambda _: DEFAULT,
        lambda s, h: task.check_point(dict(s), dict(h)), per_cell=per_cell, shortlist=shortlist, rounds=4,
    )  # fmt: skip


def _regional(records: list[Record], probes: list[Record]) -> dict[int, Any]:
    winners = select_winners(records)
    bucketers = {"cost_model": {"batch": make_bucketer("ceil", [8, 16, 32, 64]),
                                "kv_len": make_bucketer("ceil", [1024])}}  # fmt: skip
    chosen = regional(winners, probes, point_timings(records, every_config), bucketers, 0.02)
    return {key_dict(w.shape)["batch"]: w for w in chosen}


def test_each_cell_is_probed_inside_its_region_with_the_default_and_its_fastest() -> None:
    records = _grid(ALIGNED)
    assert {key_dict(w.shape)["batch"]: w.config for w in select_winners(records)} == dict.fromkeys(
        (8, 16, 32, 64), FITS
    )  # at every tuned point the kernel that needs a multiple of 8 wins
    plan = _plan(records)
    assert plan.cells == 4 and len(plan.items) == 8 and not plan.skipped
    ends = {8: (1, 8), 16: (9, 16), 32: (17, 32), 64: (33, 64)}
    for item in plan.items:
        assert (
            item.phase == Phase.PROBE
            and item.arms[0] == DEFAULT
            and set(item.arms) == {DEFAULT, FITS, STEADY}
        )
        batch = key_dict(item.shape)["batch"]
        assert batch not in ends and any(lo <= batch <= hi for lo, hi in ends.values())
    assert len({i.item_id for i in plan.items}) == 8 and _plan(records).items == plan.items  # stable
    assert all(len(i.arms) == 2 for i in _plan(records, shortlist=1).items)  # default, the winner


def test_a_probe_also_measures_the_winners_at_the_other_corners_of_the_region() -> None:
    crossing = ALIGNED.replace("fixed_ms = 0.5\nunaligned_ms = 2.0\nalign_batch = 8", "per_batch_ms = 0.05")
    crossing = crossing.replace("[[configs]]\nfixed_ms = 0.8\n", "") + "[search]\nrefine_budget = 0\n"
    records = _grid(crossing)
    per_batch = make_key({"fixed_ms": 0.0, "per_batch_ms": 0.05, "per_kv_ms": 0.0})
    won = {key_dict(w.shape)["batch"]: w.config for w in select_winners(records)}
    assert won[16] == per_batch and won[32] != per_batch  # the winner changes between 16 and 32
    arms = {key_dict(i.shape)["batch"]: set(i.arms) for i in _plan(records, shortlist=1).items}
    assert all(per_batch in a for b, a in arms.items() if 17 <= b <= 32)  # 16's winner, probed in 32's region


def test_export_serves_each_probed_cell_the_config_that_holds_over_its_region() -> None:
    records = _grid(ALIGNED)
    probes = [r for item in _plan(records).items for r in answer(item)]
    chosen = _regional(records, probes)
    for batch, w in chosen.items():  # slower at the tuned point, but 1.9x faster everywhere between
        assert w.config == STEADY and w.basis == "region" and not w.is_default
        assert "least worst loss over the region: 60.0% at 3 site(s), 2 probe(s)" in w.reason
        assert w.speedup == pytest.approx(1.25) and w.rounds == 8, batch
    assert _regional(records, [])[16].config == FITS  # without probes: the point's winner


def test_a_winner_that_holds_over_its_region_keeps_its_place() -> None:
    steady_only = ALIGNED.replace("unaligned_ms = 2.0", "unaligned_ms = 0.0")
    records = _grid(steady_only)
    probes = [r for item in _plan(records).items for r in answer(item)]
    fits = make_key({"fixed_ms": 0.5, "per_batch_ms": 0.0, "per_kv_ms": 0.0})
    for w in _regional(records, probes).values():
        assert (
            w.config == fits and w.basis != "region" and "held over the region: worst loss 0.0%" in w.reason
        )
        served = dataclasses.replace(w, served_by=make_key({"batch": 8}), served_why="no result")
        assert "served by the tuned point" in served.reason and served.reason.endswith(w.region)


def test_a_probe_that_failed_or_a_config_not_probed_everywhere_decides_nothing() -> None:
    records = _grid(ALIGNED)
    items = _plan(records).items
    probes = [r for item in items for r in answer(item)]
    # the steady config missing from one probe of cell 16: only the configs measured at every site remain
    broken = [r for r in probes if not (r.config == STEADY and key_dict(r.shape)["batch"] == 14)]
    cell = _regional(records, broken)[16]  # of those probed everywhere, the default loses least (2x)
    assert cell.config == DEFAULT and cell.is_default and cell.basis == "region"
    assert _regional(records, broken)[32].config == STEADY
    failed = [dataclasses.replace(r, status=Status.ERROR) if r.is_default else r for r in probes]
    assert all(w.basis != "region" for w in _regional(records, failed).values())


def test_probing_what_cannot_be_probed_is_one_line_and_exit_2(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["probe", "r-none", "--results", str(tmp_path / "res")])
    assert out.exit_code == 2 and "no run 'r-none'" in out.output and "Traceback" not in out.output
    out = CliRunner().invoke(app, ["probe", "r-none", "--per-cell", "0", "--results", str(tmp_path)])
    assert out.exit_code == 2 and "--per-cell" in out.output


def _probed_work(spec_text: str) -> Any:
    spec = _spec("", spec_text)
    task = CostModel()
    made = plan(spec, task)
    search = Search(made, spec.search)

    def check(static: Any, shape: Any) -> str | None:
        return task.check_point(dict(static), dict(shape))

    return probed(refined(search, made, check), search, made, check, None)


PROBED = ALIGNED + "[search]\nprobes = 2\nrounds = 4\n"


def test_probes_in_the_spec_follow_the_grid_in_the_same_run_and_resume_alike() -> None:
    whole = drive(_probed_work(PROBED))
    probes = [r for r in whole if r.phase == Phase.PROBE]
    assert len({r.shape_key for r in probes}) == 8 and len(probes) == len({r.item_id for r in probes}) == 24
    grid = [r for r in whole if r.phase != Phase.PROBE]
    assert whole.index(probes[0]) > max(whole.index(r) for r in grid if r.phase == Phase.FINAL)  # grid first
    chosen = _regional(grid, probes)
    assert {w.config for w in chosen.values()} == {STEADY}

    items = len({r.group_id or r.item_id for r in whole})
    for stop in (3, items - 3):  # in the grid; among the probes (the last 8 items)
        work = _probed_work(PROBED)
        first = drive(work, stop_after=stop)
        assert work.missing() > 0
        resumed = _probed_work(PROBED)
        rest = drive(resumed, first)
        assert resumed.missing() == 0
        ids = [r.item_id for r in rest]
        assert len(ids) == len(set(ids)) == len(whole)  # one row per planned arm, none twice
        assert {r.item_id for r in rest} == {r.item_id for r in whole}


def test_probes_in_a_spec_without_ranges_are_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "p.toml"
    spec.write_text(PROBED.replace("range = [1, 64]\n", ""))
    out = CliRunner().invoke(app, ["submit", str(spec), "--results", str(tmp_path / "res")])
    assert out.exit_code == 2 and "search.probes" in out.output and "declare range" in out.output
    assert "Traceback" not in out.output and not (tmp_path / "res").exists()
