"""The report's page as a reader meets it: every plot the page's width, no plot title or alt text
repeating the heading above it, a bundle of the results' own winners not drawn twice, no Validation
section without a validation, and a one-sample measurement's noise shown as unknown."""

from __future__ import annotations

import dataclasses
import re
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import TINY_SPEC
from tests.finished_run import finished_run
from tests.unit.test_report import _Page
from tunectl.cli import app
from tunectl.core.keys import make_key
from tunectl.core.record import Record
from tunectl.report.draw import grid_figure
from tunectl.report.grids import Group, Point, speedup_grids


def _one_sample_at_batch_4(row: Record) -> Record:
    """One sample at batch 4; every row measured by one worker, half a second a call."""
    row = dataclasses.replace(
        row, worker="w0", started_at=row.finished_at - 0.5, measure_ms=400.0, mean_us=row.median_us
    )
    if row.shape_key == '{"batch":4,"kv_len":128}':
        return dataclasses.replace(row, num_samples=1, rel_noise=0.0)
    return row


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finished_run(tmp_path_factory.mktemp("page") / "results", TINY_SPEC, _one_sample_at_batch_4)


def _report(results: Path, out: Path, *extra: str) -> str:
    done = CliRunner().invoke(app, ["report", "--results", str(results), "--out", str(out), *extra])
    assert done.exit_code == 0, done.output
    return (out / "index.html").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def page(results: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The report of the results with a bundle exported from them: its HTML and its folder."""
    work = tmp_path_factory.mktemp("report")
    exported = CliRunner().invoke(
        app,
        [
            "export",
            "bundle",
            "--results",
            str(results),
            "--name",
            "tiny",
            "--version",
            "1",
            "--out",
            str(work / "bundles"),
        ],
    )
    assert exported.exit_code == 0, exported.output
    return _report(
        results, work / "report", "--bundle", str(work / "bundles" / "tiny" / "1")
    ), work / "report"


def _section(html: str, name: str) -> str:
    start = html.index(f'<section id="{name}">')
    return html[start : html.index("</section>", start)]


def _png_width(path: Path) -> int:
    return int(struct.unpack(">I", path.read_bytes()[16:20])[0])


def test_every_plot_is_drawn_and_shown_the_pages_width(page: tuple[str, Path]) -> None:
    html, folder = page
    assert re.search(r"\bimg \{ width: 100%;", html), "each plot fills the page's column"
    images = _Page(html).images
    assert images and {_png_width(folder / src) for src in images} == {1250}


def test_no_plot_repeats_the_heading_above_it(page: tuple[str, Path]) -> None:
    html, _ = page
    headings = re.findall(r"<h3>([^<]+)</h3>", html)
    alts = re.findall(r'<img src="[^"]+" alt="([^"]+)"', html)
    assert headings and alts
    assert not any(heading in alt for heading in headings for alt in alts), alts


def test_a_heatmap_titles_only_the_values_its_heading_does_not_say() -> None:
    group = Group("t", "cpu", make_key({"d": 1}))
    points = [
        Point(
            group, make_key({"batch": b, "kv_len": k, "page": p}), make_key({"s": 1}), True, 1.0, 10.0, 10.0
        )
        for b in (1, 2)
        for k in (64, 128)
        for p in (8, 16)
    ]
    three_dims = speedup_grids(points, "speedup")
    assert [grid_figure(g).get_suptitle() for g in three_dims] == ["at page=8", "at page=16"]
    two_dims = speedup_grids([dataclasses.replace(p, shape=p.shape[:2]) for p in points[::2]], "speedup")
    assert [grid_figure(g).get_suptitle() for g in two_dims] == [""]


def test_a_bundle_of_the_results_own_winners_is_not_drawn_again(page: tuple[str, Path]) -> None:
    html, _ = page
    bundle = _section(html, "bundle")
    assert "<img" not in bundle and 'data-repeats="speedup"' in bundle
    assert "every entry (6)" in bundle, "its entries are still listed"
    assert "<img" in _section(html, "speedup")


def test_there_is_no_validation_section_without_a_validation(page: tuple[str, Path]) -> None:
    html, _ = page
    assert 'id="validation"' not in html and 'href="#validation"' not in html


def test_a_one_sample_measurement_shows_its_noise_as_unknown(page: tuple[str, Path]) -> None:
    html, _ = page
    cells = _Page(html).find("noise", data_shape='{"batch":4,"kv_len":128}')
    assert cells and all(c["text"] == "?" for c in cells), [c["text"] for c in cells]
    assert all("data-value" not in c and "one sample, its noise unknown" in c["title"] for c in cells)


def test_the_time_section_says_where_each_workers_span_went(page: tuple[str, Path]) -> None:
    html, _ = page
    time = _section(html, "time")
    rows = re.findall(r"<tr><td>(r[^<]+)</td><td>([^<]+)</td><td class=\"num\">([0-9.]+)</td>", time)
    assert [worker for _, worker, _ in rows] == ["w0"]  # one run, one worker
    (share,) = [float(v) for v in re.findall(r'data-value="([0-9.e-]+)"', time)]
    assert 0.0 < share < 1.0
    assert '<a href="#time">time</a>' in html
