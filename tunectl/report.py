"""An HTML report of what tuning found, for the people who run inference fleets.

``write_report`` reads the results dataset (and, optionally, a bundle) and writes ``index.html`` with
PNG plots beside it:

- per (task, device, static key), each shape's winner and its speedup over the untuned default, as a
  heatmap over two shape dimensions (one heatmap per value of any others), coloured around 1.0;
- the noise of every measurement, shape by config, with failures marked by their status;
- validation rows (a bundle's config against the default, run as an L-layer stack): each shape's
  speedup with its 95 % interval, and their geometric mean;
- a bundle's entries and the same heatmaps computed from its statistics;
- above them, a summary: runs, measurements by status, winners, geometric-mean speedup.

Every number a plot shows is also in an HTML table. The page is self-contained: local images, no
network, and one inline script that counts the plots that loaded (``data-plots-rendered`` and
``data-plots-total`` on ``<body>``), so a headless browser can check the page renders.

Gathering (``gather``: rows and a bundle in, plain data out) is kept apart from drawing (matplotlib's
Agg canvas, no pyplot state) and from writing the HTML.
"""

from __future__ import annotations

import html
import json
import math
import re
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunectl import stats
from tunectl.errors import UserError
from tunectl.keys import Key, Value, key_from_text, key_text, value_order
from tunectl.results import atomic_write, read_results
from tunectl.select import Winner, latest_comparisons, select_winners

if TYPE_CHECKING:
    from tunectl.runtime import Bundle

INDEX = "index.html"
_PLOT_FILE = re.compile(r"(speedup|noise|validation|bundle)-\d+\.png")
_DPI = 110


@dataclass(frozen=True)
class Group:
    """What a winner is chosen for, shape aside: a task on a device with one static key."""

    task: str
    device: str
    static: Key

    @property
    def title(self) -> str:
        on = f" on {self.device}" if self.device else ""
        return f"{self.task}{on}: {label(self.static)}"


@dataclass(frozen=True)
class Point:
    """One tuned shape: the config that won there and its speedup over the default."""

    group: Group
    shape: Key
    config: Key
    is_default: bool
    speedup: float | None
    median_us: float | None
    default_median_us: float | None
    interval: tuple[float, float] | None = None
    reason: str = ""  # why this config is the entry, where selection says


@dataclass(frozen=True)
class Cell:
    value: float | None  # what the colour shows; None: a failure, or no default to compare with
    text: str
    note: str = ""  # the tooltip
    status: str = "ok"
    shape: Key = ()
    config: Key | None = None


@dataclass(frozen=True)
class Grid:
    """A heatmap and the table beside it: ``cells[(row, column)]``, written to ``plot``."""

    kind: str  # speedup | noise
    group: Group
    fixed: Key  # shape dimensions beyond rows and columns, at the values this grid holds
    row_name: str
    col_name: str
    rows: tuple[str, ...]
    cols: tuple[str, ...]
    cells: Mapping[tuple[int, int], Cell]
    plot: str

    @property
    def title(self) -> str:
        return self.group.title + (f"; {label(self.fixed)}" if self.fixed else "")


@dataclass(frozen=True)
class SpeedupPanel:
    group: Group
    grids: tuple[Grid, ...]
    points: tuple[Point, ...]


@dataclass(frozen=True)
class Check:
    """One validated shape: the bundle's config against the default, as an L-layer stack."""

    shape: Key
    config: Key
    status: str
    speedup: float | None
    lo: float | None
    hi: float | None
    layers: int | None
    rounds: int | None
    message: str


@dataclass(frozen=True)
class ValidationPanel:
    group: Group
    checks: tuple[Check, ...]
    plot: str  # "" when no check has a speedup to draw

    @property
    def geomean(self) -> float | None:
        return geomean(c.speedup for c in self.checks if c.status == "ok")


@dataclass(frozen=True)
class BundleSection:
    name: str  # name/version
    location: str
    points: tuple[Point, ...]
    panels: tuple[SpeedupPanel, ...]


@dataclass(frozen=True)
class ReportData:
    runs: Mapping[str, int]  # run -> rows
    statuses: Mapping[str, int]
    phases: Mapping[str, int]
    points: tuple[Point, ...]
    speedup: tuple[SpeedupPanel, ...]
    noise: tuple[Grid, ...]
    validation: tuple[ValidationPanel, ...]
    bundle: BundleSection | None

    @property
    def grids(self) -> tuple[Grid, ...]:
        bundle_panels = self.bundle.panels if self.bundle else ()
        return (
            *(g for p in (*self.speedup, *bundle_panels) for g in p.grids),
            *self.noise,
        )


@dataclass(frozen=True)
class ReportResult:
    index: Path
    plots: tuple[Path, ...]
    num_rows: int
    num_winners: int


def label(key: Key) -> str:
    """``name=value`` pairs of a key, for people."""
    return " ".join(f"{name}={_value_text(v)}" for name, v in key) or "-"


def _value_text(value: Value) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(map(_value_text, value)) + ")"
    return str(value)


def _value_order(value: Value) -> tuple[str, Any]:
    """Values by value (batch 4 before 16), values of different types apart by type name."""
    return type(value).__name__, repr(value) if isinstance(value, tuple) else value


def geomean(values: Iterable[float | None]) -> float | None:
    """Geometric mean of the positive values; None where there are none."""
    positive = [v for v in values if v is not None and v > 0]
    return stats.geomean(positive) if positive else None


def _group(row: Mapping[str, Any]) -> Group:
    return Group(row["task"], row["device_name"] or "", key_from_text(row["static_key"]))


def _latest(rows: Iterable[Mapping[str, Any]], *fields: str) -> list[Mapping[str, Any]]:
    """The last finished row per value of ``fields``."""
    latest: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for row in rows:
        key = tuple(row[f] for f in fields)
        if key not in latest or row["finished_at"] >= latest[key]["finished_at"]:
            latest[key] = row
    return list(latest.values())


def _by_group(items: Iterable[Any], group_of: Callable[[Any], Group]) -> dict[Group, list[Any]]:
    groups: dict[Group, list[Any]] = {}
    for item in items:
        groups.setdefault(group_of(item), []).append(item)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0].task, kv[0].device, value_order(kv[0].static))))


def point_of_winner(winner: Winner) -> Point:
    lo, hi = getattr(winner, "speedup_lo", None), getattr(winner, "speedup_hi", None)
    return Point(
        Group(winner.task, winner.device_name, winner.static),
        winner.shape,
        winner.config,
        winner.is_default,
        winner.speedup,
        winner.median_us,
        winner.default_median_us,
        (lo, hi) if lo is not None and hi is not None else None,
        getattr(winner, "reason", ""),
    )


def _json_key(params: Mapping[str, Any]) -> Key:
    return key_from_text(json.dumps(params))


def bundle_points(bundle: Bundle) -> tuple[Point, ...]:
    """Every entry of ``bundle`` as a point, its speedup from the bundle's statistics."""
    device = str(bundle.manifest.get("environment", {}).get("device_name", ""))
    points = []
    for task in bundle.tasks:
        for entry in bundle.entries(task):
            median, default = entry.get("median_us"), entry.get("default_median_us")
            speedup = entry.get("speedup")
            if speedup is None and median and default:
                speedup = default / median
            lo, hi = entry.get("speedup_lo"), entry.get("speedup_hi")
            points.append(
                Point(
                    Group(task, device, _json_key(entry["static"])),
                    _json_key(entry["shape"]),
                    _json_key(entry["config"]),
                    bool(entry.get("is_default", False)),
                    speedup,
                    median,
                    default,
                    (lo, hi) if lo is not None and hi is not None else None,
                    str(entry.get("reason") or ""),
                )
            )
    return tuple(points)


def _dims(shapes: Iterable[Key]) -> dict[str, list[Value]]:
    values: dict[str, set[Value]] = {}
    for shape in shapes:
        for name, v in shape:
            values.setdefault(name, set()).add(v)
    return {name: sorted(vs, key=_value_order) for name, vs in sorted(values.items())}


def _axes(dims: Mapping[str, Sequence[Value]]) -> tuple[str, str]:
    """The two dimensions with the most values (rows, then columns, in name order); "" for none."""
    widest = sorted(sorted(dims, key=lambda n: -len(dims[n]))[:2])
    row, col = ["", "", *widest][-2:]
    return row, col


def speedup_grids(points: Sequence[Point], plot_prefix: str, first: int = 1) -> tuple[Grid, ...]:
    """Heatmaps of one group's points: shape dimensions as rows and columns, one per value of the rest."""
    dims = _dims(p.shape for p in points)
    row_name, col_name = _axes(dims)
    rows = dims.get(row_name, [None])
    cols = dims.get(col_name, [None])
    by_rest: dict[Key, list[Point]] = {}
    for p in points:
        rest = tuple((n, v) for n, v in p.shape if n not in (row_name, col_name))
        by_rest.setdefault(rest, []).append(p)
    grids = []
    for n, rest in enumerate(sorted(by_rest, key=value_order), start=first):
        cells = {}
        for p in by_rest[rest]:
            shape = dict(p.shape)
            at = rows.index(shape.get(row_name)), cols.index(shape.get(col_name))
            note = (
                label(p.config)
                + (" (default)" if p.is_default else "")
                + (f"\n{p.reason}" if p.reason else "")
            )
            text = f"{p.speedup:.2f}" if p.speedup is not None else "no default"
            cells[at] = Cell(p.speedup, text, note, shape=p.shape, config=p.config)
        grids.append(
            Grid(
                "speedup",
                points[0].group,
                rest,
                row_name,
                col_name,
                tuple("" if v is None else _value_text(v) for v in rows),
                tuple("" if v is None else _value_text(v) for v in cols),
                cells,
                f"{plot_prefix}-{n:03d}.png",
            )
        )
    return tuple(grids)


def speedup_panels(points: Iterable[Point], plot_prefix: str) -> tuple[SpeedupPanel, ...]:
    panels: list[SpeedupPanel] = []
    for group, members in _by_group(points, lambda p: p.group).items():
        ordered = sorted(members, key=lambda p: value_order(p.shape))
        first = sum(len(p.grids) for p in panels) + 1
        panels.append(SpeedupPanel(group, speedup_grids(ordered, plot_prefix, first), tuple(ordered)))
    return tuple(panels)


def _noise_cell(row: Mapping[str, Any], shape: Key, config: Key) -> Cell:
    if row["status"] != "ok":
        message = (row["message"] or "").strip().splitlines()
        note = f"{row['status']}: {message[0][:200]}" if message else row["status"]
        return Cell(None, row["status"].replace("_result", ""), note, row["status"], shape, config)
    noise, median = row["rel_noise"], row["median_us"]
    note = f"median {median:,.1f} µs ({row['phase']})" if median is not None else row["phase"]
    text = f"{noise:.1%}" if noise is not None else "-"
    return Cell(noise, text, note, "ok", shape, config)


def noise_grid(group: Group, rows: Sequence[Mapping[str, Any]], plot: str) -> Grid:
    """Shapes by configs of one group: each measurement's relative noise, or its failure."""
    parsed = [(key_from_text(r["shape_key"]), key_from_text(r["config_key"]), r) for r in rows]
    shapes = sorted({s for s, _, _ in parsed}, key=value_order)
    defaults = {c for _, c, r in parsed if r["is_default"]}
    configs = sorted({c for _, c, _ in parsed}, key=lambda c: (c not in defaults, value_order(c)))
    cells = {
        (shapes.index(shape), configs.index(config)): _noise_cell(row, shape, config)
        for shape, config, row in parsed
    }
    return Grid(
        "noise",
        group,
        (),
        "shape",
        "config",
        tuple(map(label, shapes)),
        tuple(label(c) + (" (default)" if c in defaults else "") for c in configs),
        cells,
        plot,
    )


def _check(row: Mapping[str, Any]) -> Check:
    return Check(
        key_from_text(row["shape_key"]),
        key_from_text(row["config_key"]),
        row["status"],
        row["speedup"],
        row["speedup_lo"],
        row["speedup_hi"],
        row["layers"],
        row["rounds"],
        row["message"] or "",
    )


def _compared_arms(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Per shape, the arms of its latest validation that are not the default (the default's arm where it
    was compared with itself alone)."""
    chosen: list[Mapping[str, Any]] = []
    for arms in latest_comparisons(rows, "validate").values():
        chosen += [r for r in arms if not r["is_default"]] or arms
    return chosen


def validation_panels(rows: Iterable[Mapping[str, Any]]) -> tuple[ValidationPanel, ...]:
    """Per group, each shape's latest validation: its config's arm against the default."""
    panels = []
    for n, (group, members) in enumerate(_by_group(_compared_arms(rows), _group).items(), start=1):
        checks = tuple(sorted(map(_check, members), key=lambda c: value_order(c.shape)))
        drawable = any(c.status == "ok" and c.speedup is not None for c in checks)
        panels.append(ValidationPanel(group, checks, f"validation-{n:03d}.png" if drawable else ""))
    return tuple(panels)


def gather(rows: Sequence[Mapping[str, Any]], bundle: Bundle | None = None) -> ReportData:
    """What the report shows, from result rows (and a loaded bundle)."""
    measured = [r for r in rows if r["phase"] != "validate"]
    points = tuple(point_of_winner(w) for w in select_winners(measured))
    noise_rows = _latest(measured, "task", "device_name", "static_key", "shape_key", "config_key")
    noise = tuple(
        noise_grid(group, members, f"noise-{n:03d}.png")
        for n, (group, members) in enumerate(_by_group(noise_rows, _group).items(), start=1)
    )
    section = None
    if bundle is not None:
        entries = bundle_points(bundle)
        section = BundleSection(
            f"{bundle.name}/{bundle.version}", bundle.location, entries, speedup_panels(entries, "bundle")
        )
    return ReportData(
        runs=dict(sorted(Counter(r["run_id"] for r in rows).items())),
        statuses=dict(Counter(r["status"] for r in rows).most_common()),
        phases=dict(Counter(r["phase"] for r in rows).most_common()),
        points=points,
        speedup=speedup_panels(points, "speedup"),
        noise=noise,
        validation=validation_panels(rows),
        bundle=section,
    )


def _cell_inches(count: int, most: float) -> float:
    """Inches per cell: ``most`` for a few, shrinking to fit, the whole side kept under 36 inches."""
    count = max(count, 1)
    return min(most, max(min(0.2, 36.0 / count), 14.0 / count))


def _wrap(text: str, inches: float) -> str:
    return "\n".join(textwrap.wrap(text, max(30, int(inches * 11))))


def _colour_scale(grid: Grid) -> tuple[Any, Any]:
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm, Normalize

    values = [c.value for c in grid.cells.values() if c.value is not None and c.value > 0]
    if grid.kind == "speedup":
        extent = max([1.1, *(max(v, 1 / v) for v in values)])
        return colormaps["RdBu"], LogNorm(1 / extent, extent)
    return colormaps["YlOrRd"], Normalize(0.0, max([0.05, *values]))


def _colour_bar(grid: Grid, bar: Any) -> None:
    from matplotlib.ticker import PercentFormatter

    if grid.kind == "noise":
        bar.set_label("relative noise")
        bar.formatter = PercentFormatter(1.0)
        return
    top = bar.norm.vmax
    ticks = [1 / top, 1 / math.sqrt(top), 1.0, math.sqrt(top), top]
    bar.set_ticks(ticks, labels=[f"{t:.2f}×" for t in ticks])
    bar.minorticks_off()
    bar.set_label("speedup over default (×)")


_FAILED: dict[str, Any] = {"facecolor": "#c8c8c8", "edgecolor": "#555555", "hatch": "//", "lw": 0}


def _mark_cells(grid: Grid, ax: Any, cmap: Any, norm: Any, annotate: bool) -> bool:
    """Grey out cells without a value (hatched where they failed), write the numbers; any failed?"""
    from matplotlib.patches import Rectangle

    failed = False
    for (i, j), cell in grid.cells.items():
        if cell.value is None:
            failed |= cell.status != "ok"
            style = _FAILED if cell.status != "ok" else {**_FAILED, "hatch": ""}
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, **style))
        if not annotate:
            continue
        r, g, b, _ = cmap(norm(cell.value)) if cell.value is not None else (1, 1, 1, 1)
        colour = "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"
        box = {"boxstyle": "round,pad=0.15", "fc": "white", "lw": 0} if cell.status != "ok" else None
        ax.text(j, i, cell.text, ha="center", va="center", fontsize=7, color=colour, bbox=box)
    return failed


def draw_grid(grid: Grid, path: Path) -> None:
    import numpy as np
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    values = np.full((len(grid.rows), len(grid.cols)), np.nan)
    for (i, j), cell in grid.cells.items():
        values[i, j] = np.nan if cell.value is None else cell.value
    longest = max(map(len, grid.cols))
    rotate = grid.kind == "noise" or longest > 6
    col_in, row_in = _cell_inches(len(grid.cols), 0.75), _cell_inches(len(grid.rows), 0.45)
    width = 3.0 + len(grid.cols) * col_in + 0.07 * max(map(len, grid.rows))
    height = 1.5 + len(grid.rows) * row_in + (0.07 * longest if rotate else 0.2)
    fig = Figure(figsize=(width, height), layout="constrained")
    ax = fig.add_subplot()
    cmap, norm = _colour_scale(grid)
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=norm, aspect="auto")
    _colour_bar(grid, fig.colorbar(image, ax=ax, shrink=0.9))
    if _mark_cells(grid, ax, cmap, norm, annotate=col_in >= 0.5 and row_in >= 0.25):
        fig.legend(handles=[Patch(**_FAILED, label="failed")], loc="outside lower left", fontsize=8)
    ax.set_xticks(
        range(len(grid.cols)), grid.cols, rotation=90 if rotate else 0, fontsize=min(8, 50 * col_in)
    )
    ax.set_yticks(range(len(grid.rows)), grid.rows, fontsize=min(8, 50 * row_in))
    ax.set_xlabel(grid.col_name)
    ax.set_ylabel(grid.row_name)
    ax.set_title(_wrap(grid.title, width), fontsize=9, loc="left")
    fig.savefig(path, dpi=_DPI)


def draw_validation(panel: ValidationPanel, path: Path) -> None:
    from matplotlib.figure import Figure

    checks = [c for c in panel.checks if c.status == "ok" and c.speedup is not None]
    speedups = [c.speedup or 0.0 for c in checks]
    below = [s - (s if c.lo is None else c.lo) for c, s in zip(checks, speedups, strict=True)]
    above = [(s if c.hi is None else c.hi) - s for c, s in zip(checks, speedups, strict=True)]
    labels = [label(c.shape) for c in checks]
    width = 3.0 + len(checks) * _cell_inches(len(checks), 0.75)
    fig = Figure(figsize=(max(5.0, width), 4.0 + 0.06 * max(map(len, labels))), layout="constrained")
    ax = fig.add_subplot()
    x = range(len(checks))
    colours = ["#2166ac" if s >= 1 else "#b2182b" for s in speedups]
    ax.bar(x, [s - 1 for s in speedups], bottom=1.0, color=colours, alpha=0.45, width=0.6)
    ax.errorbar(x, speedups, yerr=[below, above], fmt="o", color="black", capsize=4, label="speedup, 95 %")
    ax.axhline(1.0, color="grey", lw=1)
    if panel.geomean is not None:
        ax.axhline(panel.geomean, color="#4d9221", ls="--", label=f"geometric mean {panel.geomean:.3f}×")
    ax.set_xticks(x, labels, rotation=90 if len(checks) > 4 else 0, fontsize=8)
    ax.set_ylabel("speedup over default (×)")
    ax.set_title(_wrap(panel.group.title, width), fontsize=9, loc="left")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=_DPI)


def draw(data: ReportData, out: Path) -> tuple[Path, ...]:
    """Every plot of ``data`` as a PNG in ``out``, replacing those of an earlier report."""
    for old in out.iterdir():
        if _PLOT_FILE.fullmatch(old.name):
            old.unlink()
    plots = []
    for grid in data.grids:
        draw_grid(grid, out / grid.plot)
        plots.append(out / grid.plot)
    for panel in data.validation:
        if panel.plot:
            draw_validation(panel, out / panel.plot)
            plots.append(out / panel.plot)
    return tuple(plots)


_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1300px; padding: 0 1em;
       color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 2px solid #ddd; margin-top: 2em; }
h3 { font-size: 1.05em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 2px 7px; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th[scope=row] { text-align: left; background: #f6f6f6; } thead th { background: #eee; }
td.fail { background: #f3e1e1; color: #8b1a1a; font-style: italic; }
td.none { color: #999; }
caption { text-align: left; font-weight: 600; padding: 2px 0; white-space: nowrap; }
img { max-width: 100%; height: auto; display: block; margin: 0.6em 0; }
.note { color: #555; } details { margin: 0.4em 0 1em; } summary { cursor: pointer; }
.scroll { overflow-x: auto; }
"""

_COUNT_PLOTS = """
addEventListener("load", () => {
  const plots = Array.from(document.images);
  document.body.dataset.plotsTotal = plots.length;
  document.body.dataset.plotsRendered = plots.filter((p) => p.complete && p.naturalWidth > 0).length;
});
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _attrs(**attrs: object) -> str:
    return "".join(
        f' {name.rstrip("_").replace("_", "-")}="{_e(v)}"' for name, v in attrs.items() if v is not None
    )


def _td(text: str, cls: str = "num", **attrs: object) -> str:
    return f"<td{_attrs(class_=cls or None, **attrs)}>{_e(text)}</td>"


def _table(head: Sequence[str], body: Iterable[str], caption: str = "", cls: str = "") -> str:
    cap = f"<caption>{_e(caption)}</caption>" if caption else ""
    header = "".join(f'<th scope="col">{_e(h)}</th>' for h in head)
    rows = "\n".join(body)
    return (
        f'<div class="scroll"><table{_attrs(class_=cls or None)}>{cap}<thead><tr>{header}</tr></thead>'
        f"<tbody>\n{rows}\n</tbody></table></div>"
    )


def _speedup_text(value: float | None) -> str:
    return f"{value:.3f}×" if value is not None else "-"


def _interval_text(lo: float | None, hi: float | None) -> str:
    return f"{lo:.3f}–{hi:.3f}" if lo is not None and hi is not None else "-"


def _img(plot: str, alt: str) -> str:
    return f'<img src="{_e(plot)}" alt="{_e(alt)}">' if plot else ""


def _grid_html(grid: Grid) -> str:
    corner = f"{grid.row_name} \\ {grid.col_name}" if grid.row_name else grid.col_name
    body = []
    for i, row in enumerate(grid.rows):
        cells = []
        for j in range(len(grid.cols)):
            cell = grid.cells.get((i, j))
            if cell is None:
                cells.append(_td("", "none"))
                continue
            cls = "fail" if cell.status != "ok" else "num" if cell.value is not None else "none"
            cells.append(
                _td(
                    cell.text,
                    cls,
                    title=cell.note or None,
                    data_shape=key_text(cell.shape),
                    data_config=key_text(cell.config) if cell.config is not None else None,
                    data_value=repr(cell.value) if cell.value is not None else None,
                    data_status=cell.status,
                )
            )
        body.append(f'<tr><th scope="row">{_e(row)}</th>{"".join(cells)}</tr>')
    what = "speedup over default" if grid.kind == "speedup" else "relative noise (failures: status)"
    caption = what + (f" at {label(grid.fixed)}" if grid.fixed else "")
    return _img(grid.plot, f"{caption}: {grid.title}") + _table(
        [corner, *grid.cols], body, caption, f"grid {grid.kind}"
    )


def _points_html(points: Sequence[Point], with_group: bool) -> str:
    head = [*(("task", "device", "static") if with_group else ()), "shape", "config"]
    head += ["median µs", "default µs", "speedup", "95 % interval"]
    body = []
    for p in points:
        group = [_td(p.group.task, ""), _td(p.group.device, ""), _td(label(p.group.static), "")]
        body.append(
            "<tr>"
            + "".join(group if with_group else [])
            + _td(label(p.shape), "", data_shape=key_text(p.shape))
            + _td(label(p.config) + (" (default)" if p.is_default else ""), "", title=p.reason or None)
            + _td(f"{p.median_us:,.1f}" if p.median_us is not None else "-")
            + _td(f"{p.default_median_us:,.1f}" if p.default_median_us is not None else "no default")
            + _td(_speedup_text(p.speedup), data_value=repr(p.speedup) if p.speedup is not None else None)
            + _td(_interval_text(*(p.interval or (None, None))))
            + "</tr>"
        )
    return _table(head, body, cls="points")


def _speedup_html(panels: Sequence[SpeedupPanel], empty: str) -> str:
    if not panels:
        return f'<p class="note">{_e(empty)}</p>'
    parts = []
    for panel in panels:
        parts.append(f"<h3>{_e(panel.group.title)}</h3>")
        parts += [_grid_html(g) for g in panel.grids]
        parts.append(f"<details><summary>winners ({len(panel.points)})</summary>")
        parts.append(_points_html(panel.points, with_group=False) + "</details>")
    return "\n".join(parts)


def _validation_html(panels: Sequence[ValidationPanel]) -> str:
    if not panels:
        return '<p class="note">no validation rows</p>'
    parts = []
    head = ["shape", "config", "layers", "rounds", "status", "speedup", "95 % interval"]
    for panel in panels:
        body = [
            "<tr>"
            + _td(label(c.shape), "", data_shape=key_text(c.shape), data_status=c.status)
            + _td(label(c.config), "")
            + _td("-" if c.layers is None else str(c.layers))
            + _td("-" if c.rounds is None else str(c.rounds))
            + _td(c.status, "fail" if c.status != "ok" else "", title=c.message or None)
            + _td(_speedup_text(c.speedup), data_value=repr(c.speedup) if c.speedup is not None else None)
            + _td(_interval_text(c.lo, c.hi))
            + "</tr>"
            for c in panel.checks
        ]
        g = panel.geomean
        body.append(
            '<tr><th scope="row" colspan="5">geometric mean (ok shapes)</th>'
            + _td(_speedup_text(g), data_geomean=repr(g) if g is not None else None)
            + _td("")
            + "</tr>"
        )
        parts += [f"<h3>{_e(panel.group.title)}</h3>", _img(panel.plot, f"validation: {panel.group.title}")]
        parts.append(_table(head, body, "speedup of the bundle's config, as an L-layer stack", "validation"))
    return "\n".join(parts)


def _bundle_html(section: BundleSection | None) -> str:
    if section is None:
        return ""
    return (
        f'<section id="bundle"><h2>Bundle {_e(section.name)}</h2>'
        f'<p class="note">from {_e(section.location)}; speedups from the bundle\'s own statistics.</p>'
        f"{_points_html(section.points, with_group=True)}"
        f"{_speedup_html(section.panels, 'the bundle has no entries')}</section>"
    )


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {name}" for name, n in counts.items()) or "none"


def _summary_html(data: ReportData, source: str) -> str:
    g = geomean(p.speedup for p in data.points)
    validated = geomean(c.speedup for p in data.validation for c in p.checks if c.status == "ok")
    lines = [
        ("results", source, None),
        ("runs", ", ".join(f"{run} ({n} rows)" for run, n in data.runs.items()), None),
        ("measurements by status", _counts(data.statuses), None),
        ("measurements by phase", _counts(data.phases), None),
        ("winners", str(len(data.points)), len(data.points)),
        ("geometric-mean speedup of winners", _speedup_text(g), g),
        ("geometric-mean speedup validated", _speedup_text(validated), validated),
    ]
    if data.bundle is not None:
        lines.append(("bundle", f"{data.bundle.name} ({len(data.bundle.points)} entries)", None))
    body = "\n".join(
        f'<tr><th scope="row">{_e(name)}</th><td{_attrs(data_value=value)}>{_e(text)}</td></tr>'
        for name, text, value in lines
    )
    return f'<table class="summary"><tbody>{body}</tbody></table>'


_NO_MEASUREMENTS = '<p class="note">no measurements</p>'


def render_html(data: ReportData, source: str) -> str:
    """The page, referring to each plot by its file name beside it."""
    generated = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return f"""<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>tunectl report</title><style>{_STYLE}</style></head>
<body>
<h1>tunectl report</h1>
<p class="note">generated {_e(generated)}</p>
<section id="summary"><h2>Summary</h2>{_summary_html(data, source)}</section>
<section id="speedup"><h2>Speedup over default per shape</h2>
<p class="note">The winner at each shape: its speedup over the untuned default (1.00: the default kept its
place). Hover a cell in a table for the winning config and why it won.</p>
{_speedup_html(data.speedup, "no winners: no configuration finished with status ok")}</section>
<section id="noise"><h2>Noise per measurement</h2>
<p class="note">Each measurement's relative noise (the latest per shape and config); failed measurements
show their status instead.</p>
{"".join(f"<h3>{_e(g.title)}</h3>{_grid_html(g)}" for g in data.noise) or _NO_MEASUREMENTS}</section>
<section id="validation"><h2>Validation</h2>
<p class="note">A bundle's config against the default, each run as an L-layer stack: the paired speedup
with its 95 % interval.</p>
{_validation_html(data.validation)}</section>
{_bundle_html(data.bundle)}
<script>{_COUNT_PLOTS}</script>
</body>
</html>
"""


def load_report_bundle(source: str) -> Bundle:
    """The bundle at ``source`` (directory, archive, URI or STORE/NAME@CHANNEL), statistics read."""
    from tunectl.runtime import BundleError
    from tunectl.stores import read_bundle

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
    """Write ``out/index.html`` and its plots from ``results`` (some runs of it) and a bundle's source."""
    results, out = Path(results), Path(out)
    if not results.is_dir():
        raise UserError(f"no results dataset at {results}: pass --results DIR")
    loaded = load_report_bundle(bundle) if bundle is not None else None
    rows = read_results(results, run_ids=run_ids)
    if not rows:
        runs = f" for run(s) {', '.join(run_ids)}" if run_ids else ""
        raise UserError(f"no measurements in {results}{runs}")
    data = gather(rows, loaded)
    out.mkdir(parents=True, exist_ok=True)
    plots = draw(data, out)
    page = render_html(data, str(results)).encode()
    atomic_write(out / INDEX, lambda f: f.write(page))
    return ReportResult(out / INDEX, plots, len(rows), len(data.points))
