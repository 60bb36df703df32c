"""Heatmap grids: what each cell of a speedup or noise heatmap shows, and labels that fit.

Labels name only what differs: a grid's configs are labelled by the options that vary among them
(``num_splits=4``, not every option of the config), its shapes by the values of the dimensions that
vary (``8×1024``, the dimensions named on the axis), so a heatmap of 14 configs stays readable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tunectl.core.keys import Key, Value, value_order

#: every plot's width: the page's column is 1300 px wide, and a plot at 100 dpi fills it (1250 px)
PAGE_WIDTH_IN = 12.5


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
    mark: str = ""  # speedup: the winner's letter in the grid's legend ("" for the default)
    interval: tuple[float, float] | None = None


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
    legend: tuple[tuple[str, str], ...] = ()  # speedup: (letter, config) of each winner but the default

    @property
    def title(self) -> str:
        return self.group.title + (f"; {label(self.fixed)}" if self.fixed else "")


def label(key: Key) -> str:
    """``name=value`` pairs of a key, for people."""
    return " ".join(f"{name}={value_text(v)}" for name, v in key) or "-"


def value_text(value: Value) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(map(value_text, value)) + ")"
    return str(value)


def _value_order(value: Value) -> tuple[str, Any]:
    """Values by value (batch 4 before 16), values of different types apart by type name."""
    return type(value).__name__, repr(value) if isinstance(value, tuple) else value


def short_labels(keys: Iterable[Key]) -> dict[Key, str]:
    """Each key labelled by the parameters that take two or more values among ``keys`` (a parameter
    some keys lack counts as varying only where leaving it out would give two keys one label); a key
    left with nothing to show keeps its full label."""
    keys = list(dict.fromkeys(keys))
    seen: dict[str, set[Value]] = {}
    for key in keys:
        for name, v in key:
            seen.setdefault(name, set()).add(v)
    partial = {n for n in seen if any(n not in dict(k) for k in keys)}
    for varying in (
        {n for n, vs in seen.items() if len(vs) > 1},
        {n for n, vs in seen.items() if len(vs) > 1} | partial,
    ):
        names = {k: label(tuple((n, v) for n, v in k if n in varying)) for k in keys}
        if len(set(names.values())) == len(keys):
            break
    return {k: name if name != "-" else label(k) for k, name in names.items()}


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


def _letters(count: int) -> list[str]:
    letters = [chr(ord("A") + i) for i in range(26)]
    return (letters + [a + b for a in letters for b in letters])[:count]


def _speedup_cell(p: Point, letter: Mapping[Key, str]) -> Cell:
    note = label(p.config) + (" (default)" if p.is_default else "") + (f"\n{p.reason}" if p.reason else "")
    text = f"{p.speedup:.2f}" if p.speedup is not None else "no default"
    mark = "" if p.is_default else letter[p.config]
    return Cell(p.speedup, text, note, shape=p.shape, config=p.config, mark=mark, interval=p.interval)


def speedup_grids(points: Sequence[Point], plot_prefix: str, first: int = 1) -> tuple[Grid, ...]:
    """Heatmaps of one group's points: shape dimensions as rows and columns, one per value of the rest.

    Each winner other than the default gets a letter, the same in every grid of the group, and the
    grid's legend names its config in full (a winner's options mean little without the default's)."""
    dims = _dims(p.shape for p in points)
    row_name, col_name = _axes(dims)
    rows, cols = dims.get(row_name, [None]), dims.get(col_name, [None])
    winners = sorted({p.config for p in points if not p.is_default}, key=value_order)
    letter = dict(zip(winners, _letters(len(winners)), strict=True))
    by_rest: dict[Key, list[Point]] = {}
    for p in points:
        by_rest.setdefault(tuple((n, v) for n, v in p.shape if n not in (row_name, col_name)), []).append(p)
    grids = []
    for n, rest in enumerate(sorted(by_rest, key=value_order), start=first):
        cells = {}
        for p in by_rest[rest]:
            shape = dict(p.shape)
            cells[rows.index(shape.get(row_name)), cols.index(shape.get(col_name))] = _speedup_cell(p, letter)
        used = {c.config for c in cells.values() if c.mark}
        legend = tuple((letter[c], label(c)) for c in winners if c in used)
        grids.append(
            Grid(
                "speedup",
                points[0].group,
                rest,
                row_name,
                col_name,
                tuple("" if v is None else value_text(v) for v in rows),
                tuple("" if v is None else value_text(v) for v in cols),
                cells,
                f"{plot_prefix}-{n:03d}.png",
                legend,
            )
        )
    return tuple(grids)


def _config_row(name: str, is_default: bool) -> str:
    if not is_default:
        return name
    return "default" if name == "-" else f"{name} (default)"


def noise_grid(group: Group, cells: Sequence[Cell], plot: str, *, defaults: Iterable[Key] = ()) -> Grid:
    """Configs by shapes of one group: each measurement's relative noise, or its failure.

    Configs are rows (labels read across, the default first), shapes columns (their varying values,
    ``8×1024``, the dimensions named on the axis)."""
    shapes = sorted({c.shape for c in cells}, key=value_order)
    defaults = set(defaults)
    configs = sorted({c.config for c in cells if c.config is not None}, key=value_order)
    configs.sort(key=lambda c: c not in defaults)
    names = short_labels(configs)
    varying = [n for n, vs in _dims(shapes).items() if len(vs) > 1] or [n for n, _ in shapes[0]]
    placed = {(configs.index(c.config), shapes.index(c.shape)): c for c in cells if c.config is not None}
    return Grid(
        "noise",
        group,
        (),
        "config",
        " × ".join(varying),
        tuple(_config_row(names[c], c in defaults) for c in configs),
        tuple("×".join(value_text(dict(s)[n]) for n in varying if n in dict(s)) for s in shapes),
        placed,
        plot,
    )
