"""The report: its tables hold the numbers tuning found, and a headless browser renders its plots."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tunectl.cli import app
from tunectl.core.keys import key_text, make_key
from tunectl.core.record import Record
from tunectl.decide.select import select_winners
from tunectl.formats.task_tables import entry_of
from tunectl.report import Group, Point, speedup_grids
from tunectl.store.bundle import TaskTable, build_files, publish_local
from tunectl.store.results import ResultsWriter, read_results

DECODE, PREFILL = "toy_decode", "toy_prefill"
STATIC = key_text(make_key({"dtype": "float32", "head_dim": 64}))
DEVICE = "cpu: test"
BATCHES, KV_LENS, SPLITS = (1, 4), (64, 128, 256), (1, 2, 4)
CRASHED = (1, 256, 4)  # batch, kv_len, num_splits
#: the winner's speedup at each (batch, kv_len): num_splits=2 is 0.8x the default's time from kv_len
#: 128, num_splits=4 is 0.5x at (4, 256) and slower elsewhere; at kv_len 64 the default keeps its place
EXPECTED = {(1, 64): 1.0, (4, 64): 1.0, (1, 128): 1.25, (4, 128): 1.25, (1, 256): 1.25, (4, 256): 2.0}
VALIDATED = {(1, 128): (1.2, 1.1, 1.3), (4, 256): (1.8, 1.6, 2.0)}  # speedup, lo, hi


def _median(batch: int, kv_len: int, splits: int) -> float:
    base = 10.0 * batch * kv_len / 64
    if splits == 2:
        return base * (0.8 if kv_len >= 128 else 1.1)
    if splits == 4:
        return base * (0.5 if (batch, kv_len) == (4, 256) else 1.3)
    return base


def _shape(**dims: int) -> str:
    return key_text(make_key(dims))


def _record(n: int, task: str, shape: str, config: str, **fields: Any) -> Record:
    return Record(
        run_id="r-report",
        item_id=f"i{n:03d}",
        task=task,
        static_key=STATIC,
        shape_key=shape,
        config_key=config,
        device_name=DEVICE,
        finished_at=1_700_000_000.0 + n,
        **fields,
    )


def _records() -> list[Record]:
    records = []
    for batch in BATCHES:
        for kv_len in KV_LENS:
            for splits in SPLITS:
                config = _shape(num_splits=splits)
                common = {"is_default": splits == 1, "num_samples": 20}
                if (batch, kv_len, splits) == CRASHED:
                    status = {"status": "crash", "message": "worker died running it"}
                else:
                    median = _median(batch, kv_len, splits)
                    status = {"status": "ok", "median_us": median, "p20_us": median, "p80_us": median}
                    status |= {"rel_noise": 0.02 + 0.01 * splits}
                shape = _shape(batch=batch, kv_len=kv_len)
                records.append(_record(len(records), DECODE, shape, config, **common, **status))
    for q_len, median in ((128, 50.0), (512, 200.0)):
        for splits, factor in ((1, 1.0), (2, 0.5)):
            records.append(
                _record(
                    len(records),
                    PREFILL,
                    _shape(q_len=q_len),
                    _shape(num_splits=splits),
                    is_default=splits == 1,
                    status="ok",
                    median_us=median * factor,
                    p20_us=median * factor,
                    p80_us=median * factor,
                    rel_noise=0.01,
                    num_samples=20,
                )
            )
    for (batch, kv_len), (speedup, lo, hi) in VALIDATED.items():
        for splits, arm in ((1, (1.0, 0.99, 1.01)), (2, (speedup, lo, hi))):
            records.append(_validation(len(records), batch, kv_len, splits, arm))
    for splits in (1, 2):
        records.append(_validation(len(records), 4, 64, splits, None, status="error"))
    return records


def _validation(
    n: int, batch: int, kv_len: int, splits: int, arm: tuple[float, float, float] | None, status: str = "ok"
) -> Record:
    """One arm of a validation: num_splits as a 32-layer stack against the default, in 10 rounds."""
    speedup, lo, hi = arm or (None, None, None)
    return _record(
        n,
        DECODE,
        _shape(batch=batch, kv_len=kv_len),
        _shape(num_splits=splits),
        is_default=splits == 1,
        status=status,
        message="" if status == "ok" else "the stack ran out of memory",
        phase="validate",
        group_id=f"g-{batch}-{kv_len}",
        layers=32,
        rounds=10,
        speedup=speedup,
        speedup_lo=lo,
        speedup_hi=hi,
    )


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("results")
    writer = ResultsWriter(root)
    for record in _records():
        writer.append(record)
    writer.close()
    return root


def _publish_bundle(results: Path, store: Path, changed_speedup: float) -> Path:
    """A bundle of the results' winners, with the speedup at (4, 256) replaced in its statistics."""
    winners = select_winners([r for r in read_results(results) if r.phase != "validate"])
    tables = []
    for task in (DECODE, PREFILL):
        entries = []
        for w in (w for w in winners if w.task == task):
            entry = entry_of(w)
            if dict(w.shape) == {"batch": 4, "kv_len": 256}:
                entry = replace(entry, speedup=changed_speedup)
            entries.append(entry)
        dims = {name for w in winners if w.task == task for name, _ in w.shape}
        points = {d: sorted({dict(e.shape)[d] for e in entries}) for d in sorted(dims)}
        shapes = {d: {"policy": "exact", "points": points[d]} for d in sorted(dims)}
        tables.append(TaskTable(task, ("dtype", "head_dim"), shapes, tuple(entries)))
    files = build_files("fleet", "1", tables, ["r-report"], {"device_name": DEVICE})
    return publish_local(store, "fleet", "1", files)


@pytest.fixture(scope="module")
def report(results: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of ``results`` with a bundle, written through the CLI; its index.html."""
    work = tmp_path_factory.mktemp("report")
    bundle = _publish_bundle(results, work / "bundles", changed_speedup=3.0)
    out = work / "report"
    done = CliRunner().invoke(
        app, ["report", "--results", str(results), "--bundle", str(bundle), "--out", str(out)]
    )
    assert done.exit_code == 0, done.output
    assert f"wrote {out / 'index.html'}" in done.output
    return out / "index.html"


class _Page(HTMLParser):
    """Table cells (with their section and attributes), images and the body's attributes of a page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.section = ""
        self.rows = 0
        self.cells: list[dict[str, Any]] = []
        self.images: list[str] = []
        self.body: dict[str, str | None] = {}
        self._cell: dict[str, Any] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "section":
            self.section = found.get("id") or ""
        elif tag == "body":
            self.body = found
        elif tag == "img":
            self.images.append(found["src"] or "")
        elif tag == "tr":
            self.rows += 1
        elif tag == "td":
            self._cell = {**found, "section": self.section, "row": self.rows, "text": ""}
            self.cells.append(self._cell)

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell["text"] += data

    def row_of(self, cell: dict[str, Any]) -> list[str]:
        """The texts of the cells in ``cell``'s table row."""
        return [c["text"] for c in self.cells if c["row"] == cell["row"]]

    def find(self, section: str, **attrs: str) -> list[dict[str, Any]]:
        wanted = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [
            c for c in self.cells if c["section"] == section and all(c.get(k) == v for k, v in wanted.items())
        ]


def _page(index: Path) -> _Page:
    return _Page(index.read_text(encoding="utf-8"))


def test_the_speedup_cells_are_the_default_median_over_the_winners(report: Path) -> None:
    page = _page(report)
    for (batch, kv_len), expected in EXPECTED.items():
        (cell,) = page.find("speedup", data_shape=_shape(batch=batch, kv_len=kv_len), data_status="ok")
        winner = json.loads(cell["data-config"])["num_splits"]
        default_over_winner = _median(batch, kv_len, 1) / _median(batch, kv_len, winner)
        assert float(cell["data-value"]) == pytest.approx(default_over_winner) == expected
        assert cell["text"] == f"{expected:.2f}"
    (best,) = page.find("speedup", data_shape=_shape(batch=4, kv_len=256), data_status="ok")
    assert best["title"].splitlines()[0] == "num_splits=4"
    assert best["data-config"] == _shape(num_splits=4)
    (kept,) = page.find("speedup", data_shape=_shape(batch=1, kv_len=64), data_status="ok")
    assert kept["title"].splitlines()[0] == "num_splits=1 (default)"
    (one_dim,) = page.find("speedup", data_shape=_shape(q_len=512), data_status="ok")
    assert float(one_dim["data-value"]) == pytest.approx(2.0)


def test_noise_shows_every_measurement_and_each_failure_by_its_status(report: Path) -> None:
    page = _page(report)
    noise = [c for c in page.find("noise") if c["class"] != "none"]
    assert len(noise) == len(BATCHES) * len(KV_LENS) * len(SPLITS) + 4
    batch, kv_len, splits = CRASHED
    (crash,) = page.find("noise", data_status="crash")
    assert crash["text"] == "crash" and crash["class"] == "fail" and "worker died" in crash["title"]
    assert crash["data-shape"] == _shape(batch=batch, kv_len=kv_len)
    assert crash["data-config"] == _shape(num_splits=splits)
    (cell,) = page.find("noise", data_shape=_shape(batch=4, kv_len=128), data_config=_shape(num_splits=4))
    assert float(cell["data-value"]) == pytest.approx(0.06) and cell["text"] == "6.0%"


def test_validation_shows_each_shape_with_its_interval_and_the_geometric_mean(report: Path) -> None:
    page = _page(report)
    for (batch, kv_len), (speedup, lo, hi) in VALIDATED.items():
        (cell,) = page.find("validation", data_shape=_shape(batch=batch, kv_len=kv_len), data_status="ok")
        interval = f"{lo:.3f}–{hi:.3f}"
        row = ["num_splits=2", "32", "10", "ok", f"{speedup:.3f}×", interval, "faster"]
        assert page.row_of(cell)[1:] == row
    (failed,) = page.find("validation", data_status="error")
    assert page.row_of(failed)[1:] == ["num_splits=2", "32", "10", "error", "-", "-", "error"]
    assert "the stack ran out of memory" in report.read_text(encoding="utf-8")
    (mean,) = [c for c in page.cells if "data-geomean" in c]
    assert mean["section"] == "validation"
    assert float(mean["data-geomean"]) == pytest.approx((1.2 * 1.8) ** 0.5)


def test_the_bundle_section_takes_speedups_from_the_bundle(report: Path) -> None:
    page = _page(report)
    entries = page.find("bundle", data_shape=_shape(batch=4, kv_len=256))
    assert {float(c["data-value"]) for c in entries if "data-value" in c} == {3.0}
    (results_cell,) = page.find("speedup", data_shape=_shape(batch=4, kv_len=256), data_status="ok")
    assert float(results_cell["data-value"]) == pytest.approx(2.0)
    assert len(page.find("bundle", data_status="ok")) == len(EXPECTED), "the decode heatmap, drawn again"


def test_the_summary_counts_runs_statuses_winners_and_the_mean(report: Path) -> None:
    text = report.read_text(encoding="utf-8")
    summary = text[text.index('<section id="summary">') : text.index('<section id="speedup">')]
    assert "r-report (28 rows)" in summary
    assert "25 ok, 2 error, 1 crash" in summary
    assert re.search(r'data-value="8">8</td>', summary)
    mean = (1.25**3 * 2.0 * 2.0 * 2.0) ** (1 / 8)
    assert f"{mean:.3f}×" in summary


def test_every_plot_the_page_shows_is_a_png_beside_it(report: Path) -> None:
    page = _page(report)
    assert len(page.images) == 2 + 2 + 1 + 1  # speedup, noise, validation, the bundle's changed heatmap
    for src in page.images:
        assert "/" not in src and (report.parent / src).read_bytes().startswith(b"\x89PNG")


def test_text_from_the_results_is_escaped(results: Path, tmp_path: Path) -> None:
    root = tmp_path / "results"
    shutil.copytree(results, root)
    writer = ResultsWriter(root)
    evil = "<script>alert(1)</script>"
    writer.append(
        _record(
            999,
            DECODE,
            _shape(batch=8, kv_len=64),
            _shape(num_splits=1),
            status="error",
            message=evil,
            is_default=True,
        )
    )
    writer.close()
    done = CliRunner().invoke(app, ["report", "--results", str(root), "--out", str(tmp_path / "out")])
    assert done.exit_code == 0, done.output
    text = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert evil not in text and html.escape(evil) in text


def test_more_than_two_shape_dimensions_give_one_grid_per_value_of_the_rest() -> None:
    group = Group("t", "", make_key({"d": 1}))
    points = [
        Point(group, make_key({"a": a, "b": b, "c": c}), make_key({"s": 1}), True, 1.0, 1.0, 1.0)
        for a in (1, 2)
        for b in (8, 16, 32)
        for c in (0, 1)
    ]
    grids = speedup_grids(points, "speedup")
    assert [g.plot for g in grids] == ["speedup-001.png", "speedup-002.png"]
    assert [(g.row_name, g.col_name, g.rows, g.cols) for g in grids] == [
        ("a", "b", ("1", "2"), ("8", "16", "32"))
    ] * 2
    assert [g.title.endswith(f"; c={c}") for g, c in zip(grids, (0, 1), strict=True)] == [True, True]
    (one,) = speedup_grids([replace(points[0], shape=make_key({"q": 3}))], "x")
    assert (one.row_name, one.rows, one.col_name, one.cols) == ("", ("",), "q", ("3",))


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--results", "{tmp}/nowhere"], "no results dataset"),
        (["--results", "{tmp}/empty"], "no measurements"),
        (["--results", "{results}", "--run", "r-none"], "no measurements"),
        (["--results", "{results}", "--bundle", "{tmp}/no-bundle"], "cannot load bundle"),
    ],
    ids=["no-results", "empty-results", "unknown-run", "bad-bundle"],
)
def test_bad_input_exits_2_with_one_line(results: Path, tmp_path: Path, args: list[str], words: str) -> None:
    (tmp_path / "empty").mkdir()
    argv = [a.format(tmp=tmp_path, results=results) for a in args]
    done = CliRunner().invoke(app, ["report", *argv, "--out", str(tmp_path / "out")])
    assert done.exit_code == 2, done.output
    assert done.stderr.startswith("error: ") and words in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.output
    assert not (tmp_path / "out").exists()


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found is None:
        if os.environ.get("TUNECTL_REQUIRE_CHROMIUM") == "1":
            pytest.fail("TUNECTL_REQUIRE_CHROMIUM=1 but no chromium binary is on PATH")
        pytest.skip("no chromium binary (set TUNECTL_REQUIRE_CHROMIUM=1 to make this a failure)")
    return found


def _browse(index: Path, profile: Path, *flags: str) -> str:
    """Open ``index`` in headless Chromium with ``flags``; what it prints."""
    argv = [
        _chromium(),
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1400,3000",
        *flags,
        index.as_uri(),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _plots_rendered(dom: str) -> tuple[int, int]:
    body = _Page(dom).body
    return int(body["data-plots-rendered"] or -1), int(body["data-plots-total"] or -1)


def test_a_browser_renders_every_plot_of_the_page(report: Path, tmp_path: Path) -> None:
    rendered, total = _plots_rendered(_browse(report, tmp_path / "profile", "--dump-dom"))
    assert rendered == total > 0
    shot = tmp_path / "page.png"
    _browse(report, tmp_path / "profile", f"--screenshot={shot}")
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (3000, 1400) and pixels[..., :3].std() > 0.05


def test_the_browser_check_fails_when_a_plot_is_missing(report: Path, tmp_path: Path) -> None:
    copy = tmp_path / "report"
    shutil.copytree(report.parent, copy)
    next(copy.glob("noise-*.png")).unlink()
    rendered, total = _plots_rendered(_browse(copy / "index.html", tmp_path / "profile", "--dump-dom"))
    assert rendered == total - 1 and total > 0
