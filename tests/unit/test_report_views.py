"""What the report draws for a person: labels that fit, a noise scale one outlier cannot wash out,
winners and intervals on the heatmaps, verdicts on validations, and imported logs against their pick."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.unit.test_report import _Page, results  # noqa: F401 (the results fixture)
from tunectl.cli import app
from tunectl.core.keys import make_key
from tunectl.report.draw import draw_grid, noise_scale
from tunectl.report.gather import Check
from tunectl.report.grids import Cell, Group, Point, noise_grid, short_labels, speedup_grids

FLEX_LOG = Path(__file__).parents[1] / "data" / "flex_logs" / "torch211-h200-forward-backward.json"
GROUP = Group("t", "", make_key({"d": 1}))


def test_one_wild_noise_value_is_clipped_so_the_others_keep_their_colours() -> None:
    cells = [
        Cell(0.01, "1.0%", shape=make_key({"b": b}), config=make_key({"s": s}))
        for b in (1, 2, 4, 8)
        for s in (1, 2, 4, 8, 16)
    ]
    cells.append(Cell(91.0, "9100.0%", shape=make_key({"b": 16}), config=make_key({"s": 1})))
    norm, clipped = noise_scale(noise_grid(GROUP, cells, "noise-001.png"))
    assert clipped and norm.vmax <= 0.05
    assert norm(0.01) >= 0.5, "a 1 % cell sits in the upper half of the colours, not pale"
    assert norm(91.0) == pytest.approx(1.0)


def test_configs_are_labelled_by_the_options_that_differ() -> None:
    a = make_key({"backend": "flex", "num_stages": 2, "kpack": 2})
    b = make_key({"backend": "flex", "num_stages": 3, "kpack": 2})
    extern = make_key({"backend": "extern"})
    assert short_labels([a, b]) == {a: "num_stages=2", b: "num_stages=3"}
    names = short_labels([a, b, extern])
    assert len(set(names.values())) == 3 and names[extern] == "backend=extern"
    plain, split = make_key({"backend": "fa4"}), make_key({"backend": "fa4", "num_splits": 0})
    assert short_labels([plain, split]) == {plain: "backend=fa4", split: "num_splits=0"}


def test_a_heatmap_of_fourteen_long_configs_stays_within_the_page(tmp_path: Path) -> None:
    from matplotlib.image import imread

    configs = [
        make_key({"backend": "sdpa", "sdpa_backend": f"cudnn-variant-{i}", "gqa": "expand"})
        for i in range(14)
    ]
    shapes = [make_key({"batch": b, "kv_len": k}) for b in (1, 4, 16, 64, 256) for k in (1024, 8192, 32768)]
    cells = [Cell(0.003, "0.3%", shape=s, config=c) for s in shapes for c in configs]
    grid = noise_grid(GROUP, cells, "noise-001.png", defaults=[configs[0]])
    draw_grid(grid, tmp_path / grid.plot)
    height, width = imread(tmp_path / grid.plot).shape[:2]
    assert width <= 1300 and height <= 900
    assert grid.rows[0] == "sdpa_backend=cudnn-variant-0 (default)"
    assert grid.cols[:2] == ("1×1024", "1×8192") and grid.col_name == "batch × kv_len"


def test_speedup_cells_carry_the_interval_and_a_letter_for_the_winner() -> None:
    fast, default = make_key({"s": 4}), make_key({"s": 1})
    points = [
        Point(GROUP, make_key({"b": 1}), fast, False, 1.5, 10.0, 15.0, (1.4, 1.6)),
        Point(GROUP, make_key({"b": 2}), default, True, 1.0, 10.0, 10.0, (0.99, 1.01)),
    ]
    (grid,) = speedup_grids(points, "speedup")
    won, kept = grid.cells[(0, 0)], grid.cells[(0, 1)]
    assert (won.mark, won.interval, kept.mark) == ("A", (1.4, 1.6), "")
    assert grid.legend == (("A", "s=4"),)


@pytest.mark.parametrize(
    ("status", "speedup", "lo", "hi", "verdict"),
    [
        ("ok", 1.2, 1.1, 1.3, "faster"),
        ("ok", 0.8, 0.7, 0.9, "slower"),
        ("ok", 1.01, 0.98, 1.04, "tie"),
        ("error", None, None, None, "error"),
    ],
)
def test_each_validation_gets_a_verdict(
    status: str, speedup: float | None, lo: float | None, hi: float | None, verdict: str
) -> None:
    check = Check(make_key({"b": 1}), make_key({"s": 2}), status, speedup, lo, hi, 36, 6, "")
    assert check.verdict == verdict


def test_an_imported_log_shows_inductors_pick_against_the_other_choices(
    results: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    root = tmp_path / "results"
    shutil.copytree(results, root)
    runner = CliRunner()
    done = runner.invoke(app, ["import", "flex-log", str(FLEX_LOG), "--results", str(root)])
    assert done.exit_code == 0, done.output
    out = tmp_path / "out"
    done = runner.invoke(app, ["report", "--results", str(root), "--out", str(out)])
    assert done.exit_code == 0, done.output
    page = _Page((out / "index.html").read_text(encoding="utf-8"))
    assert "imported-001.png" in page.images and (out / "imported-001.png").is_file()
    speedup_text = [c["text"] for c in page.find("speedup")]
    assert "no default" not in speedup_text, "imported choices are not drawn as winners without a default"
    shapes = page.find("imported", data_shape='{"batch":2,"kv_len":1024,"q_len":1024}')
    backward, forward = (page.row_of(c) for c in shapes)  # groups in kernel order
    # The real log: the forward pick ran 34.752 µs; the next choice 1.06x slower, the slowest 1.36x.
    assert forward[2:] == ["34.8", "6 (0)", "1.06× slower", "-", "1.36× slower"]
    assert backward[3] == "13 (0)" and backward[1].startswith("BLOCK_M1=")
