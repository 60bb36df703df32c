"""Candidates: export's ranked list per entry, the runtime's answer and confirmed picks, and confirming
at start-up with the CPU quickstart task (decode_attention) timed for real."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from tunectl.core.buckets import make_bucketer
from tunectl.core.keys import key_text, make_key
from tunectl.core.record import Phase, Record
from tunectl.decide.candidates import beside, candidate_lists, corners, shortlist
from tunectl.decide.select import Winner
from tunectl.measure.confirm import confirm
from tunectl.runtime import Entry, load_bundle
from tunectl.store.bundle import TaskTable, build_files, publish_local

STATIC = {"dtype": "float32", "num_q_heads": 8, "num_kv_heads": 2, "head_dim": 64, "page_size": 16}
PICK = {"gather": "index", "gqa": "grouped", "num_splits": 1}
OTHERS = [
    {"gather": "index", "gqa": "grouped", "num_splits": 4},
    {"gather": "index", "gqa": "expand", "num_splits": 2},
]
SHAPES = {"batch": {"policy": "pow2", "points": [4, 16]}, "kv_len": {"policy": "ceil", "points": [2048]}}


def _bundle(tmp_path: Path, candidates: bool = True, kv: tuple[int, ...] = (2048,)) -> Path:
    listed = tuple(make_key(c) for c in [PICK, *OTHERS]) if candidates else ()
    entries = tuple(
        Entry(make_key(STATIC), make_key({"batch": b, "kv_len": k}), make_key(PICK), candidates=listed)
        for b in (4, 16)
        for k in kv
    )
    shapes = {**SHAPES, "kv_len": {"policy": "ceil", "points": list(kv)}}
    table = TaskTable("decode_attention", tuple(sorted(STATIC)), shapes, entries)
    files = build_files("cands", "1" if candidates else "0", [table], ["r1"], {})
    return publish_local(tmp_path, "cands", "1" if candidates else "0", files)


def test_shortlist_adds_the_config_that_covers_the_region() -> None:
    pick, a, b = make_key({"s": 1}), make_key({"s": 8}), make_key({"s": 16})
    sites = [{pick: 1.0, a: 1.2, b: 1.1}, {pick: 1.3, a: 1.2, b: 1.0}, {pick: 1.2, a: 1.01, b: 1.0}]
    assert shortlist(pick, sites, 3) == (pick, b)  # a adds nothing once b is in, and is 13 % behind
    sites[1] = {pick: 1.3, a: 1.0, b: 1.1}
    assert shortlist(pick, sites, 3) == (pick, a, b)
    assert shortlist(pick, sites, 1) == (pick,)
    assert shortlist(pick, sites, 0) == ()
    assert shortlist(pick, [{pick: 1.0, a: 1.5}], 3) == (pick,)  # nothing helps: the list stays short


def test_a_covered_region_fills_its_list_with_the_configs_closest_behind() -> None:
    pick, a, b, c = (make_key({"s": s}) for s in (1, 2, 4, 8))
    sites = [{pick: 1.0, a: 1.06, b: 1.02, c: 1.3}, {pick: 1.05, a: 1.04, b: 1.03, c: 1.0}]
    assert shortlist(pick, sites, 4) == (pick, c, b, a)  # c covers a site; then b (2.5 % behind), a (5 %)
    assert shortlist(pick, sites, 3) == (pick, c, b)
    assert shortlist(pick, sites[:1], 4) == (pick, b, a)  # c, 30 % behind there, never fills


def test_the_cells_beside_a_cell_are_the_nearest_along_each_dimension() -> None:
    cells = [make_key({"batch": b, "kv_len": k}) for b, k in ((4, 1024), (8, 1024), (32, 1024), (8, 16384))]
    got = beside(make_key({"batch": 8, "kv_len": 1024}), [*cells, make_key({"batch": 64, "kv_len": 4096})])
    assert got == [cells[0], cells[2], cells[3]]  # batch 4 and 32 (not 64), kv 16384; nothing below 1024


def _probe(shape: dict[str, int], speedups: dict[Any, float], default: Any) -> list[Record]:
    """A probe's arms at ``shape``: each config's paired speedup over ``default``."""
    where = {"static_key": key_text(make_key(STATIC)), "shape_key": key_text(make_key(shape))}
    return [
        Record(
            run_id="p",
            item_id=f"{shape}-{key_text(c)}",
            task="decode_attention",
            config_key=key_text(c),
            status="ok",
            median_us=100.0 / s,
            phase=Phase.PROBE,
            is_default=c == default,
            speedup=None if c == default else s,
            group_id=str(shape),
            **where,
        )
        for c, s in speedups.items()
    ]


def test_a_list_takes_in_what_the_probes_of_the_cells_beside_it_found() -> None:
    pick, near, other = (make_key(c) for c in (PICK, *OTHERS))
    static = make_key(STATIC)
    cells = [make_key({"batch": b, "kv_len": 2048}) for b in (4, 16)]
    winners = [
        Winner("decode_attention", "", static, c, pick, True, 1.0, 1.0, 1.0, 0.0, 1, 1.0, "r", 3, 0)
        for c in cells
    ]
    timings = {("decode_attention", static, c): {pick: 100.0, near: 120.0, other: 130.0} for c in cells}
    # a probe inside batch 16's region finds ``near`` fastest; batch 4's own sites never do
    probes = _probe({"batch": 12, "kv_len": 2048}, {pick: 1.0, near: 1.25, other: 0.8}, pick)
    bucketers = {
        "decode_attention": {"batch": make_bucketer("pow2", [4, 16]), "kv_len": make_bucketer("ceil", [2048])}
    }
    policies = {"decode_attention": {"batch": "pow2", "kv_len": "ceil"}}
    lists = candidate_lists(winners, timings, probes, bucketers, policies, k=2)
    assert lists[("decode_attention", static, cells[1])] == (pick, near)  # its own probe
    assert lists[("decode_attention", static, cells[0])] == (pick, near)  # its neighbour's


def test_corners_follow_the_policy_side() -> None:
    tuned = [make_key({"batch": b, "kv_len": k}) for b in (4, 8, 16) for k in (1024, 4096)]
    cell = make_key({"batch": 8, "kv_len": 4096})
    got = set(corners(cell, tuned, {"batch": "ceil", "kv_len": "ceil"}))
    assert got == {make_key({"batch": b, "kv_len": k}) for b in (4, 8) for k in (1024, 4096)}
    assert set(corners(cell, tuned, {"batch": "nearest", "kv_len": "exact"})) == {
        make_key({"batch": b, "kv_len": 4096}) for b in (4, 8, 16)
    }


def test_candidates_ride_in_the_stats_file_and_leave_the_table_as_it_was(tmp_path: Path) -> None:
    with_list, without = _bundle(tmp_path), _bundle(tmp_path, candidates=False)
    table = "tables/decode_attention.json"
    assert json.loads((with_list / table).read_text()) == json.loads((without / table).read_text())
    stats = json.loads((with_list / "stats/decode_attention.json").read_text())["columns"]
    assert stats["candidates"][0] == [PICK, *OTHERS]
    bundle = load_bundle(with_list, env_policy="off")
    assert bundle.candidates("decode_attention", **STATIC, batch=3, kv_len=1500) == [PICK, *OTHERS]
    assert bundle.candidates("decode_attention", **STATIC, batch=64, kv_len=1500) == []
    old = load_bundle(without, env_policy="off")
    assert old.candidates("decode_attention", **STATIC, batch=3, kv_len=1500) == [PICK]


def test_confirmed_picks_answer_at_their_exact_shapes_only(tmp_path: Path) -> None:
    bundle = load_bundle(_bundle(tmp_path), env_policy="off")
    confirmed = bundle.with_confirmed(
        "decode_attention", [({**STATIC, "batch": 3, "kv_len": 1500}, OTHERS[0])]
    )
    assert confirmed.lookup("decode_attention", **STATIC, batch=3, kv_len=1500) == OTHERS[0]
    assert confirmed.lookup("decode_attention", **STATIC, batch=3.0, kv_len=1500) == OTHERS[0]
    assert confirmed.lookup("decode_attention", **STATIC, batch=4, kv_len=1500) == PICK
    assert (
        bundle.lookup("decode_attention", **STATIC, batch=3, kv_len=1500) == PICK
    )  # the original is unchanged
    with pytest.raises(ValueError):
        bundle.with_confirmed(
            "decode_attention", [({**STATIC, "head_dim": 32, "batch": 3, "kv_len": 1}, PICK)]
        )


def test_a_pick_confirmed_by_cell_serves_its_cell_at_the_exact_batch(tmp_path: Path) -> None:
    bundle = load_bundle(_bundle(tmp_path, kv=(1024, 4096)), env_policy="off")
    at, cells = {**STATIC, "batch": 3, "kv_len": 1448}, {"kv_len": [1024, 2048, 4096]}
    confirmed = bundle.with_confirmed("decode_attention", [(at, OTHERS[0])], by_cell=cells)
    for kv_len, served in ((1025, OTHERS[0]), (2048, OTHERS[0]), (2049, PICK), (1024, PICK), (8192, None)):
        assert confirmed.lookup("decode_attention", **STATIC, batch=3, kv_len=kv_len) == served, kv_len
    assert confirmed.lookup("decode_attention", **STATIC, batch=4, kv_len=1448) == PICK  # batch: exact
    both = confirmed.with_confirmed("decode_attention", [({**at, "kv_len": 1500}, OTHERS[1])])
    assert both.lookup("decode_attention", **STATIC, batch=3, kv_len=1500) == OTHERS[1]  # exact first
    assert both.lookup("decode_attention", **STATIC, batch=3, kv_len=1501) == OTHERS[0]
    assert both.lookup("decode_attention", **STATIC, batch=[3], kv_len=1501) is None  # unhashable: a miss
    coarse = confirmed.with_confirmed("decode_attention", [(at, OTHERS[1])], by_cell={"kv_len": [4096]})
    assert coarse.lookup("decode_attention", **STATIC, batch=3, kv_len=1500) == OTHERS[0]  # finest first
    assert coarse.lookup("decode_attention", **STATIC, batch=3, kv_len=3000) == OTHERS[1]
    with pytest.raises(ValueError, match="none of the cells"):
        bundle.with_confirmed("decode_attention", [({**at, "kv_len": 8192}, PICK)], by_cell=cells)
    with pytest.raises(ValueError, match="lacks kv_len"):
        bundle.with_confirmed("decode_attention", [({**STATIC, "batch": 3}, PICK)])
    with pytest.raises(ValueError, match="no shape dimension seq"):
        bundle.with_confirmed("decode_attention", [(at, PICK)], by_cell={"seq": [1]})


def test_confirming_at_batch_sizes_alone_times_each_length_cell_at_its_edges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lengths left out are confirmed cell by cell, the bundle's 1024-4096 cell cut in two: each
    point timed once (two cells share 2048). Each cell is cut in four parts, and each part gets the
    candidate fastest at its middle on the line between each candidate's times at the cell's edges;
    where the entry's own config holds its place nothing is installed. The times are fixed (a fake
    clock for the kernels), per point: the entry's config, then the two others."""
    import tunectl.measure.confirm as confirming

    bundle = load_bundle(_bundle(tmp_path, kv=(1024, 4096)), env_policy="off")
    times = {1024: [10.0, 9.9, 20.0], 2048: [10.0, 5.0, 20.0], 4096: [10.0, 5.0, 1.0]}
    timed_at: list[dict[str, Any]] = []

    def fixed(task: Any, static: Any, shape: dict[str, Any], configs: Any, **how: Any) -> list[float]:
        assert [dict(c) for c in configs] == [PICK, *OTHERS]
        timed_at.append(shape)
        return times[shape["kv_len"]]

    monkeypatch.setattr(confirming, "time_configs", fixed)
    shapes = [{"batch": 3}, {"batch": 64}]
    confirmed, reports = confirm(bundle, "decode_attention", STATIC, shapes, budget_s=60)
    assert timed_at == [{"batch": 3, "kv_len": kv} for kv in (1024, 2048, 4096)]
    # up to 1024: 9.9 against 10 is within the margin; 1024-2048: OTHERS[0] falls from 9.9 to 5, under
    # 10 already at the first part's middle (1117: 9.45). 2048-4096: OTHERS[1] falls from 20 to 1 and
    # crosses OTHERS[0]'s 5 at ~3700, so only the last part (3445-4096, middle 3755: 4.2) is its; the
    # geometric mean of the two edges (4.5 against 5) would have given it the whole cell
    assert [r.chosen for r in reports] == [PICK, OTHERS[0], OTHERS[0], None]
    assert all(r.by_cell == ("kv_len",) for r in reports[:3])
    assert [c for c, _ in reports[1].timed] == [PICK, *OTHERS]
    assert math.isclose(reports[1].timed[1][1] or 0, math.sqrt(9.9 * 5))  # shown: the geometric mean
    assert [c for _, c, _ in reports[2].parts] == [OTHERS[0]] * 3 + [OTHERS[1]]
    assert (
        "kv_len=1448 (for its kv_len cell, timed at kv_len=1024 and kv_len=2048): chose" in reports[1].line()
    )
    assert f"chose {OTHERS[0]} at kv_len 2049-3444; {OTHERS[1]} at kv_len 3445-4096 in" in reports[2].line()
    assert f"{OTHERS[1]} 4.5 µs (20.0 / 1.0)" in reports[2].line()  # the mean, then each edge's median
    assert reports[3].line() == "batch=64: no entry of the bundle serves it"
    served = {1000: PICK, 1025: OTHERS[0], 2048: OTHERS[0], 2049: OTHERS[0], 3444: OTHERS[0], 3445: OTHERS[1]}
    for kv_len, config in {**served, 4096: OTHERS[1]}.items():
        assert confirmed.lookup("decode_attention", **STATIC, batch=3, kv_len=kv_len) == config, kv_len
    assert confirmed.lookup("decode_attention", **STATIC, batch=4, kv_len=2048) == PICK  # batch 3 only


def test_a_rule_entry_is_timed_with_its_own_count_at_each_edge_and_keeps_computing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tunectl.measure.confirm as confirming
    from tunectl.runtime.rules import WaveRule

    rule = WaveRule("num_splits", "batch", "kv_len", 8.0, 256, 1, 64, (2.0, 0.01, 0.5, 0.02))
    listed = tuple(make_key(c) for c in [PICK, OTHERS[1]])
    entries = tuple(
        Entry(make_key(STATIC), make_key({"batch": 4, "kv_len": k}), make_key(PICK), rule, candidates=listed)
        for k in (1024, 4096)
    )
    shapes = {**SHAPES, "kv_len": {"policy": "ceil", "points": [1024, 4096]}}
    table = TaskTable("decode_attention", tuple(sorted(STATIC)), shapes, entries)
    bundle = load_bundle(
        publish_local(tmp_path, "r", "1", build_files("r", "1", [table], ["r1"], {})), env_policy="off"
    )
    seen: dict[int, list[dict[str, Any]]] = {}

    def fixed(task: Any, static: Any, shape: dict[str, Any], configs: Any, **how: Any) -> list[float]:
        seen[shape["kv_len"]] = [dict(c) for c in configs]
        return [10.0, 10.1] + [10.0] * (len(configs) - 2)

    monkeypatch.setattr(confirming, "time_configs", fixed)
    confirmed, reports = confirm(bundle, "decode_attention", STATIC, [{"batch": 3}], budget_s=60)
    assert [rule.count(3, k) for k in (1024, 2048, 4096)] == [2, 8, 8]  # the rule's count follows the length
    for kv_len, configs in seen.items():
        assert {**PICK, "num_splits": rule.count(3, kv_len)} in configs, kv_len  # the rule's own count there
    assert all(r.chosen == r.timed[0][0] for r in reports)  # the rule held its place: nothing installed
    for kv_len in (1000, 1500, 3000):
        assert confirmed.lookup("decode_attention", **STATIC, batch=3, kv_len=kv_len) == {
            **PICK,
            "num_splits": rule.count(3, kv_len),
        }


def test_the_plan_counts_what_confirming_would_time_and_times_nothing(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tunectl.cli import app

    bundle = str(_bundle(tmp_path, kv=(1024, 4096)))
    args = ["bundle", "confirm", bundle, "--task", "decode_attention", "--shape", "batch=3,64", "--plan"]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    # cells up to 1024, 1024-2048, 2048-4096 at batch 3 (their edges: 1024, 2048, 4096, three configs
    # each); batch 64 has no entry
    assert done.output.strip() == "would time 9 config(s) at 3 point(s) for 3 cell(s); 1 without an entry"
    exact = CliRunner().invoke(app, [*args, "--shape", "kv_len=1500,3000"])
    assert exact.output.strip() == "would time 6 config(s) at 2 point(s) for 2 cell(s); 2 without an entry"


def test_the_api_passes_its_margin_and_cell_span_to_confirming(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ConfirmOptions``: a margin of 150 % keeps the entry's own config against one 2x faster, and
    cells of up to 4x along the KV length confirm the bundle's 1024-4096 cell as one, at its edges."""
    import tunectl.measure.confirm as confirming
    from tunectl import api

    bundle = load_bundle(_bundle(tmp_path, kv=(1024, 4096)), env_policy="off")
    timed_at: list[int] = []

    def fixed(task: Any, static: Any, shape: dict[str, Any], configs: Any, **how: Any) -> list[float]:
        timed_at.append(shape["kv_len"])
        return [10.0, 5.0, 20.0]

    monkeypatch.setattr(confirming, "time_configs", fixed)
    options = api.ConfirmOptions(static=STATIC, device="cpu", cell_span=4.0)
    done = api.confirm_candidates(bundle, "decode_attention", [{"batch": 3}], options)
    assert timed_at == [1024, 4096] and [r.chosen for r in done.reports] == [OTHERS[0], OTHERS[0]]
    kept = api.confirm_candidates(
        bundle, "decode_attention", [{"batch": 3}], dataclasses.replace(options, margin=1.5)
    )
    assert [r.chosen for r in kept.reports] == [PICK, PICK]
    assert kept.bundle.lookup("decode_attention", **STATIC, batch=3, kv_len=3000) == PICK


def test_confirm_times_each_candidate_with_the_cpu_task(tmp_path: Path) -> None:
    bundle = load_bundle(_bundle(tmp_path), env_policy="off")
    shapes = [{"batch": 3, "kv_len": 1500}, {"batch": 64, "kv_len": 1500}]
    confirmed, report = confirm(bundle, "decode_attention", STATIC, shapes, budget_s=60)
    first, missed = report
    assert [dict(c) for c, _ in first.timed] == [PICK, *OTHERS]
    medians = [t for _, t in first.timed]
    assert all(t is not None and t > 0 for t in medians)
    fastest = min(medians)  # type: ignore[type-var]
    beats_own = fastest * 1.02 < medians[0]  # type: ignore[operator]
    assert first.chosen == (first.timed[medians.index(fastest)][0] if beats_own else PICK)
    assert confirmed.lookup("decode_attention", **STATIC, batch=3, kv_len=1500) == first.chosen
    assert missed.chosen is None and missed.timed == ()  # not in the bundle: nothing to time
    kept = first.chosen == PICK and any(t < medians[0] for t in medians[1:])  # type: ignore[operator]
    assert ("kept the bundle's pick" if kept else "chose") in first.line()  # a faster one within the margin


def test_confirm_keeps_the_pick_where_the_budget_ran_out(tmp_path: Path) -> None:
    bundle = load_bundle(_bundle(tmp_path), env_policy="off")
    confirmed, report = confirm(
        bundle, "decode_attention", STATIC, [{"batch": 3, "kv_len": 1500}], budget_s=0
    )
    assert report[0].skipped and report[0].chosen == PICK and report[0].timed == ()
    assert confirmed.lookup("decode_attention", **STATIC, batch=3, kv_len=1500) == PICK


def test_the_command_times_the_candidates_and_counts_what_it_did(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tunectl.cli import app

    bundle = str(_bundle(tmp_path))
    args = [
        "bundle",
        "confirm",
        bundle,
        "--task",
        "decode_attention",
        "--shape",
        "batch=16,3",
        "--device",
        "cpu",
    ]
    done = CliRunner().invoke(app, [*args, "--shape", "kv_len=2048,999999", "--all"])
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    assert text.count("batch=16, kv_len=2048: ") == 1 and "µs" in text  # three configs timed there
    assert "batch=3, kv_len=999999: no entry of the bundle serves it" in text
    assert "timed the candidates at 2 of 4 shape(s) on cpu" in text and "2 without an entry" in text
    brief = CliRunner().invoke(app, [*args, "--shape", "kv_len=2048,999999"]).output
    said = " ".join(brief.split())
    assert "no entry of the bundle serves it" not in said and "--all: a line for every shape" in said
    changed = int(said.split(" would run another config")[0].rsplit(" ", 1)[1])
    assert said.count(" µs)") == changed  # a line for each shape whose config would change, no other


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--task", "nope", "--shape", "batch=4"], "--task: must be a task of the bundle (decode_attention)"),
        (["--task", "decode_attention", "--shape", "batch"], "--shape: must be NAME=VALUE,VALUE..."),
        (
            ["--task", "decode_attention", "--shape", "batch=4", "--shape", "q_len=1"],
            "--shape: must name shape dimensions of decode_attention: batch, kv_len",
        ),
        (
            ["--task", "decode_attention", "--shape", "batch=4", "--cell-span", "1"],
            "--cell-span: must be more than 1 (a factor)",
        ),
        (
            ["--task", "decode_attention", "--shape", "batch=4,x"],
            "--shape: batch=x: must give whole numbers of 1 or more",
        ),
        (
            ["--task", "decode_attention", "--shape", "batch=0"],
            "--shape: batch=0: must give whole numbers of 1 or more",
        ),
        (
            ["--task", "decode_attention", "--shape", "batch=4", "--budget-s", "-1"],
            "--budget-s: must be 0 seconds or more",
        ),
        (
            [
                "--task",
                "decode_attention",
                "--shape",
                "batch=4",
                "--shape",
                "kv_len=2048",
                "--static",
                "dtype=float16",
            ],
            "--static: must match one static key of decode_attention's entries; 0 of 1 match",
        ),
    ],
)
def test_the_command_refuses_bad_options_in_one_line(tmp_path: Path, extra: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from tunectl.cli import app

    done = CliRunner().invoke(app, ["bundle", "confirm", str(_bundle(tmp_path)), *extra, "--device", "cpu"])
    assert done.exit_code == 2 and done.output.strip() == f"error: {message}", done.output


def test_confirm_times_candidates_in_interleaved_rounds_so_a_slowdown_falls_on_all() -> None:
    from tunectl.core.spec import MeasureSpec
    from tunectl.measure.side_by_side import ROUNDS, interleaved

    calls = {"n": 0}
    settings = MeasureSpec(warmup=0, min_samples=3, max_samples=3, noise_target=0.5, max_seconds=10.0)
    half = ROUNDS * 3  # two candidates x ROUNDS rounds x 3 samples: the device slows down half-way

    def candidate() -> float:  # two configs as fast as each other
        calls["n"] += 1
        return 10.0 if calls["n"] <= half else 20.0

    first, second = interleaved([candidate, candidate], settings)
    assert first == second == 15.0  # one after the other, the second would read 20.0 and lose


def _measured_row(task: str, l2: str, mode: str, timing: str, status: str = "ok") -> Any:
    from tunectl.core.record import Record

    return Record(
        run_id="r1",
        item_id=f"{l2}{mode}{timing}{status}",
        task=task,
        static_key="{}",
        shape_key="{}",
        config_key="{}",
        is_default=False,
        status=status,
        median_us=1.0,
        l2=l2,
        measure_mode=mode,
        timing=timing,
    )


def test_export_says_how_the_entries_were_measured_and_confirming_times_so(tmp_path: Path) -> None:
    from tunectl.api.confirming import timed_as
    from tunectl.formats.task_tables import measured_as

    rows = [_measured_row("decode_attention", "cold", "graph", "difference")] * 3 + [
        _measured_row("decode_attention", "warm", "eager", "replay"),
        _measured_row("decode_attention", "warm", "eager", "replay", status="error"),
        _measured_row("other", "warm", "eager", "replay"),
    ]
    measured = measured_as(rows, "decode_attention")
    assert measured == {"l2": "cold", "mode": "graph", "timing": "difference"}
    assert measured_as(rows, "missing") == {}
    table = TaskTable(
        "decode_attention",
        tuple(sorted(STATIC)),
        SHAPES,
        (Entry(make_key(STATIC), make_key({"batch": 4, "kv_len": 2048}), make_key(PICK)),),
        measured,
    )
    bundle = load_bundle(
        publish_local(tmp_path, "m", "1", build_files("m", "1", [table], ["r1"], {})), env_policy="off"
    )
    assert bundle.manifest["tasks"]["decode_attention"]["measured"] == measured
    mode, settings = timed_as(bundle, "decode_attention", "cuda:0")
    assert (mode, str(settings.l2), str(settings.timing)) == ("graph", "cold", "difference")
    mode, settings = timed_as(bundle, "decode_attention", "cpu")
    assert (mode, str(settings.l2)) == ("eager", "cold")
    older = load_bundle(_bundle(tmp_path), env_policy="off")  # no "measured": a warm L2, as before
    assert "measured" not in older.manifest["tasks"]["decode_attention"]
    assert str(timed_as(older, "decode_attention", "cpu")[1].l2) == "warm"


@pytest.mark.parametrize(
    ("medians", "chosen"),
    [
        ([100.0, 99.0, 90.0], 2),  # 10 % faster than the entry's own config: it replaces it
        ([100.0, 99.0, 98.5], 0),  # within the 2 % margin: a near-tie keeps the entry's config
        ([None, 99.0, 98.5], 2),  # the entry's config did not run: the fastest that did
    ],
)
def test_a_candidate_replaces_the_entrys_config_only_beyond_the_margin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, medians: list[float | None], chosen: int
) -> None:
    from tunectl.measure import side_by_side

    bundle = load_bundle(_bundle(tmp_path), env_policy="off")
    ran = [m for m in medians if m is not None]
    monkeypatch.setattr(side_by_side, "interleaved", lambda samplers, settings: ran)  # the timing, faked
    real_sampler = side_by_side.sampler_of
    order = iter(medians)

    def sampler(*args: Any) -> Any:
        made = real_sampler(*args)
        return None if next(order) is None else made

    monkeypatch.setattr(side_by_side, "sampler_of", sampler)
    _, [report] = confirm(bundle, "decode_attention", STATIC, [{"batch": 3, "kv_len": 1500}], budget_s=60)
    assert report.chosen == [PICK, *OTHERS][chosen]


def test_a_cell_left_out_along_two_dimensions_weighs_its_four_corners_as_a_plane() -> None:
    """Each part of a cell left out along two dimensions reads the four corners' times weighed as a
    plane: the product of its place between the edges along each (one-dimension cells, a line)."""
    import itertools

    from tunectl.measure.parts import Along, cell_parts, on_lines

    kv, q = Along.of("ceil", [1024, 2048], 2048), Along.of("floor", [1, 16], 1)
    corners = list(itertools.product(kv.edges, q.edges))  # (1024, 1), (1024, 16), (2048, 1), (2048, 16)
    parts = cell_parts({"batch": 3}, ["kv_len", "q_len"], [kv, q], corners)
    assert len(parts) == len(kv.parts) * len(q.parts) == 16
    # a time that is a plane over the cell, read at each part's middle, is that plane's value there
    plane = [10.0 + 0.01 * k + 2.0 * n for k, n in corners]
    for shape, weights, ranges in parts:
        [(_, at_middle)] = on_lines([({}, plane)], weights)
        assert at_middle is not None and math.isclose(sum(weights), 1.0)
        expected = 10.0 + 0.01 * shape["kv_len"] + 2.0 * shape["q_len"]
        assert math.isclose(at_middle, expected, rel_tol=1e-9), (shape, at_middle, expected)
        assert all(low <= shape[d] <= high for d, low, high in ranges)
