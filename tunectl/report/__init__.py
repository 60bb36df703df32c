"""An HTML report of what tuning found, for the people who run inference fleets.

``write_report`` reads the results dataset (and, optionally, a bundle) and writes ``index.html`` with
PNG plots beside it:

- per (task, device, static key), each shape's winner, its speedup over the untuned default with
  the interval and the winning config, as heatmaps over two shape dimensions (one per value of any
  others);
- the noise of every measurement, config by shape, with failures marked by their status;
- validation rows (a bundle's config against the default, run as an L-layer stack): each shape's
  speedup with its 95 % interval, its verdict, and their geometric mean;
- imported autotuning logs: per shape, Inductor's pick against the other choices it timed;
- where each worker's time went, per run: the share of its span the tuned kernels ran, measuring,
  loading, set-up, waiting for work;
- a bundle's entries and the same heatmaps computed from its statistics;
- above them, a summary: runs, measurements by status, winners, geometric-mean speedup.

Every number a plot shows is also in an HTML table. The page is self-contained: local images, no
network, and one inline script that counts the plots that loaded (``data-plots-rendered`` and
``data-plots-total`` on ``<body>``), so a headless browser can check the page renders.

Three parts: ``gather`` (rows and a bundle in, plain data out; the one module of the page that reads
rows), ``draw`` (matplotlib's Agg canvas, no pyplot state) and ``page`` (a Jinja2 template,
autoescaped). Beside them, ``worker_time`` reads where each worker's time went (the console's last
lines after a submit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tunectl.core.errors import NoResultsError, UserError
from tunectl.report.draw import draw
from tunectl.report.gather import ReportData, gather
from tunectl.report.grids import Group, Point, label, speedup_grids
from tunectl.report.page import render_html
from tunectl.store.results import atomic_write, read_results

if TYPE_CHECKING:
    from tunectl.runtime import Bundle

INDEX = "index.html"

__all__ = [
    "INDEX",
    "Group",
    "Point",
    "ReportData",
    "ReportResult",
    "gather",
    "label",
    "load_report_bundle",
    "render_html",
    "speedup_grids",
    "write_report",
]


@dataclass(frozen=True)
class ReportResult:
    index: Path
    plots: tuple[Path, ...]
    num_rows: int
    num_winners: int


def load_report_bundle(source: str) -> Bundle:
    """The bundle at ``source`` (directory, archive, URI or STORE/NAME@CHANNEL), statistics read."""
    from tunectl.runtime import BundleError
    from tunectl.store.stores import read_bundle

    try:
        bundle = read_bundle(source)
        bundle.check_statistics()
    except BundleError as exc:
        raise UserError(f"cannot load bundle {source}: {exc}") from None
    return bundle


def write_report(
    results: str | Path,
    out: str | Path,
    bundle: str | None = None,
    run_ids: Sequence[str] | None = None,
) -> ReportResult:
    """Write ``out/index.html`` and its plots from ``results`` (some runs of it) and a bundle's source.

    UserError, with nothing written, when there is no dataset, no measurement or no loadable bundle.
    """
    results, out = Path(results), Path(out)
    if not results.is_dir():
        raise NoResultsError(results)
    loaded = load_report_bundle(bundle) if bundle is not None else None
    rows = read_results(results, run_ids=run_ids)
    if not rows:
        runs = f" for run(s) {', '.join(run_ids)}" if run_ids else ""
        raise UserError(f"no measurements in {results}{runs}")
    data = gather(rows, loaded)
    page = render_html(data, str(results)).encode()
    out.mkdir(parents=True, exist_ok=True)
    plots = draw(data, out)
    atomic_write(out / INDEX, lambda f: f.write(page))
    return ReportResult(out / INDEX, plots, len(rows), len(data.points))
