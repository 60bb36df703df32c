"""The report's plots, as PNG files: matplotlib's Agg canvas through ``Figure`` (no pyplot state).

- speedup heatmaps: colour on a log scale centred on 1.0x; each cell shows the speedup, its 95 %
  interval where selection measured one, and the winner's letter (the legend below names it);
- noise heatmaps: relative noise on a log scale clipped at the 95th percentile (at least 5 %), so one
  wild measurement does not wash out the rest; a clipped cell still shows its own number;
- validation: each shape's speedup with its 95 % interval, coloured by verdict;
- imported logs: per shape, every choice's time over Inductor's pick (its fastest), on a log scale;
- drift: each worker's drift-guard reference over its life (``tunectl.report.drift``).

Every plot is as wide as the page's column (``PAGE_WIDTH_IN``) and carries no title of its own: the
page's heading above it says what it shows; a heatmap of one value of further shape dimensions says
which (``plot_title``).
"""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path
from typing import Any

from tunectl.core.record import NOT_FAILED
from tunectl.report.drift import draw_drift
from tunectl.report.gather import ImportedPanel, ReportData, ValidationPanel
from tunectl.report.grids import PAGE_WIDTH_IN, Grid, label

PLOT_FILE = re.compile(r"(speedup|noise|validation|bundle|imported|drift)-\d+\.png")
_DPI = 100
_FAILED: dict[str, Any] = {"facecolor": "#d0d0d0", "edgecolor": "#666666", "hatch": "//", "lw": 0}
_VERDICT_COLOURS = {"faster": "#2166ac", "slower": "#b2182b", "tie": "#878787"}


def _wrap(text: str, inches: float) -> str:
    return "\n".join(textwrap.wrap(text, max(30, int(inches * 11))))


def plot_title(grid: Grid) -> str:
    """What a heatmap says above itself: the values of the shape dimensions beyond its rows and
    columns it holds, or nothing (the page's heading names its group)."""
    return f"at {label(grid.fixed)}" if grid.fixed else ""


def _cell_size(grid: Grid) -> tuple[float, float]:
    """Inches per column and per row: room for three lines of text while it fits the page."""
    wide = 1.15 if grid.kind == "speedup" else 0.62
    label_in = 0.075 * max(map(len, grid.rows), default=1)
    col_in = min(wide, max(0.22, (PAGE_WIDTH_IN - 2.2 - label_in) / max(len(grid.cols), 1)))
    row_in = (0.62 if grid.kind == "speedup" else 0.3) if col_in >= 0.45 else 0.24
    return col_in, row_in


def _slant(ax: Any, slant: bool) -> None:
    """Long tick labels at 60 degrees, anchored at their right end under the tick."""
    if slant:
        ax.tick_params(axis="x", labelrotation=60)
        for tick in ax.get_xticklabels():
            tick.set_horizontalalignment("right")


def _times_ticks(axis: Any) -> None:
    """A log axis labelled 1×, 2×, 5× (not 10^0, 2×10^0)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.1, 1.2, 1.5, 2.0, 3.0, 5.0, 7.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _text_colour(rgba: tuple[float, ...]) -> str:
    r, g, b = rgba[:3]
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"


def _speedup_norm(grid: Grid) -> Any:
    from matplotlib.colors import LogNorm

    values = [c.value for c in grid.cells.values() if c.value is not None and c.value > 0]
    extent = max([1.1, *(max(v, 1 / v) for v in values)])
    return LogNorm(1 / extent, extent)


def noise_scale(grid: Grid) -> tuple[Any, bool]:
    """A log scale from 0.1 % to the 95th percentile of the noise (at least 5 %); clipped above?"""
    import numpy as np
    from matplotlib.colors import LogNorm

    values = [c.value for c in grid.cells.values() if c.value is not None and c.value > 0]
    top = max(0.05, float(np.percentile(values, 95))) if values else 0.05
    return LogNorm(0.001, top, clip=True), any(v > top for v in values)


def _cell_text(grid: Grid, cell: Any, detail: bool) -> str:
    if grid.kind == "noise":
        return cell.text
    lines = [f"{cell.value:.2f}×" if cell.value is not None else cell.text]
    if detail and cell.interval is not None:
        lines.append(f"[{cell.interval[0]:.2f}, {cell.interval[1]:.2f}]")
    lines.append(cell.mark or "default")
    return "\n".join(lines)


def _annotate(grid: Grid, ax: Any, cmap: Any, norm: Any, col_in: float) -> bool:
    """Grey out cells without a value (hatched where they failed), write the numbers; any failed?"""
    from matplotlib.patches import Rectangle

    failed = False
    size = 7.5 if col_in >= 0.55 else 5.5
    for (i, j), cell in grid.cells.items():
        if cell.value is None or (grid.kind == "noise" and cell.value <= 0):
            not_failed = cell.status in NOT_FAILED  # grey without hatching: a look not taken is no failure
            failed |= not not_failed
            style = {**_FAILED, "hatch": ""} if not_failed else _FAILED
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, **style))
        if col_in < 0.3:
            continue
        colour = _text_colour(cmap(norm(cell.value))) if cell.value else "black"
        text = _cell_text(grid, cell, detail=col_in >= 0.9)
        ax.text(j, i, text, ha="center", va="center", fontsize=size, color=colour, linespacing=1.15)
    return failed


def _colour_bar(grid: Grid, bar: Any) -> None:
    """Ticks a person reads: 0.1 %, 0.2 %, 0.5 % ... for noise; 1/top .. top around 1.0x for speedup."""
    from matplotlib.ticker import PercentFormatter

    norm = bar.norm
    if grid.kind == "noise":
        steps = [m * 10.0**e for e in range(-3, 2) for m in (1, 2, 5)]
        bar.set_ticks([t for t in steps if norm.vmin <= t <= norm.vmax])
        bar.formatter = PercentFormatter(1.0, decimals=1)
        bar.set_label("relative noise (log scale" + (", clipped)" if bar.extend == "max" else ")"))
    else:
        top = norm.vmax
        ticks = [1 / top, 1 / math.sqrt(top), 1.0, math.sqrt(top), top]
        bar.set_ticks(ticks, labels=[f"{t:.2f}×" for t in ticks])
        bar.set_label("speedup over default (×)")
    bar.minorticks_off()


def draw_grid(grid: Grid, path: Path) -> None:
    grid_figure(grid).savefig(path, dpi=_DPI)


def grid_figure(grid: Grid) -> Any:
    """The heatmap of ``grid`` as a matplotlib ``Figure``, the page's width."""
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    col_in, row_in = _cell_size(grid)
    legend_lines = math.ceil(len(grid.legend) / 3)
    width = PAGE_WIDTH_IN
    height = 1.0 + len(grid.rows) * row_in + 0.2 * legend_lines + (0.5 if grid.kind == "noise" else 0.1)
    fig = Figure(figsize=(width, height + (0.4 if grid.fixed else 0.0)), layout="constrained")
    ax = fig.add_subplot()
    values = np.full((len(grid.rows), len(grid.cols)), np.nan)
    for (i, j), cell in grid.cells.items():
        values[i, j] = np.nan if cell.value is None or cell.value <= 0 else cell.value
    if grid.kind == "speedup":
        cmap, norm, clipped = colormaps["RdBu"], _speedup_norm(grid), False
    else:
        cmap, (norm, clipped) = colormaps["YlOrRd"], noise_scale(grid)
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=norm, aspect="auto")
    _colour_bar(grid, fig.colorbar(image, ax=ax, shrink=0.9, extend="max" if clipped else "neither"))
    handles = [Patch(**_FAILED, label="failed")] if _annotate(grid, ax, cmap, norm, col_in) else []
    if grid.legend:
        entries = "    ".join(f"{letter}: {name}" for letter, name in grid.legend)
        fig.supxlabel(_wrap("winners: " + entries, width), fontsize=7.5, ha="left", x=0.01)
    if handles:
        fig.legend(handles=handles, loc="outside upper right", fontsize=7.5)
    rotate = grid.kind == "noise" and max(map(len, grid.cols), default=0) * 0.07 > col_in
    ax.set_xticks(range(len(grid.cols)), grid.cols, fontsize=7.5)
    _slant(ax, rotate)
    ax.set_yticks(range(len(grid.rows)), grid.rows, fontsize=7.5)
    ax.set_xlabel(grid.col_name, fontsize=8.5)
    ax.set_ylabel(grid.row_name, fontsize=8.5)
    if plot_title(grid):
        fig.suptitle(_wrap(plot_title(grid), width), x=0.01, ha="left", fontsize=9)
    return fig


def draw_validation(panel: ValidationPanel, path: Path) -> None:
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    checks = [c for c in panel.checks if c.status == "ok" and c.speedup is not None]
    speedups = [c.speedup or 0.0 for c in checks]
    below = [s - (s if c.lo is None else c.lo) for c, s in zip(checks, speedups, strict=True)]
    above = [(s if c.hi is None else c.hi) - s for c, s in zip(checks, speedups, strict=True)]
    labels = [label(c.shape) for c in checks]
    slant = len(checks) > 4
    width = PAGE_WIDTH_IN
    fig = Figure(
        figsize=(width, 3.2 + (0.045 * max(map(len, labels)) if slant else 0.2)), layout="constrained"
    )
    ax = fig.add_subplot()
    x = range(len(checks))
    colours = [_VERDICT_COLOURS.get(c.verdict, "#878787") for c in checks]
    spread = max([*speedups, 1.0]) / min([*speedups, 1.0])
    if spread > 3:  # 1.06x and 7.2x on one axis: a linear one flattens the small gains to nothing
        ax.set_yscale("log")
        _times_ticks(ax.yaxis)
    ax.bar(x, [s - 1 for s in speedups], bottom=1.0, color=colours, alpha=0.45, width=0.6)
    ax.errorbar(x, speedups, yerr=[below, above], fmt="o", color="black", capsize=4, label="speedup, 95 %")
    ax.axhline(1.0, color="grey", lw=1)
    if panel.geomean is not None:
        ax.axhline(panel.geomean, color="#4d9221", ls="--", label=f"geometric mean {panel.geomean:.3f}×")
    ax.set_xticks(x, labels, fontsize=7.5)
    _slant(ax, slant)
    ax.set_ylabel("speedup over default (×)")
    verdicts = [Patch(color=c, alpha=0.45, label=v) for v, c in _VERDICT_COLOURS.items()]
    handles = [*ax.get_legend_handles_labels()[0], *verdicts]
    ax.legend(handles=handles, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path, dpi=_DPI)


def draw_imported(panel: ImportedPanel, path: Path) -> None:
    """Per shape (a row), each choice's time over Inductor's pick: how much its autotuning won."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(PAGE_WIDTH_IN, 1.0 + 0.38 * len(panel.points)), layout="constrained")
    ax = fig.add_subplot()
    for i, point in enumerate(panel.points):
        ratios = [r for r in map(point.over_pick, point.choices) if r is not None]
        ax.scatter(ratios[1:], [i] * len(ratios[1:]), s=16, color="#888888", alpha=0.7, lw=0)
        if ratios:
            ax.scatter([1.0], [i], s=60, color="#2166ac", marker="D", zorder=3)
    ax.set_xscale("log")
    ax.set_xlim(left=0.95)
    _times_ticks(ax.xaxis)
    names = [label(p.shape) + (f"\n({p.num_failed} failed)" if p.num_failed else "") for p in panel.points]
    ax.set_yticks(range(len(panel.points)), names, fontsize=7.5)
    ax.invert_yaxis()
    ax.set_xlabel("time over Inductor's pick (×, log scale): ◆ the pick, ● every other choice")
    fig.savefig(path, dpi=_DPI)


def draw(data: ReportData, out: Path) -> tuple[Path, ...]:
    """Every plot of ``data`` as a PNG in ``out``, replacing those of an earlier report."""
    for old in out.iterdir():
        if PLOT_FILE.fullmatch(old.name):
            old.unlink()
    plots = []
    for grid in data.grids:
        draw_grid(grid, out / grid.plot)
        plots.append(out / grid.plot)
    for panel in data.validation:
        if panel.plot:
            draw_validation(panel, out / panel.plot)
            plots.append(out / panel.plot)
    for imported in data.imported:
        draw_imported(imported, out / imported.plot)
        plots.append(out / imported.plot)
    if data.drift is not None:
        draw_drift(data.drift, out / data.drift.plot)
        plots.append(out / data.drift.plot)
    return tuple(plots)
