"""Confirm a bundle's candidates at a serving process's own shapes, at start-up.

A bundle entry serves a region with one config chosen at its tuned point; between tuned points
another config can be faster. Export gives each entry a short ranked list of configs measured
around its cell (``Bundle.candidates``, ``tunectl.decide.candidates``). ``confirm`` times each
candidate at each shape the caller will run, side by side in interleaved rounds through the task's
own path (``tunectl.measure.side_by_side``: a slowdown meanwhile falls on every candidate alike),
and returns a bundle whose ``lookup`` (``Bundle.with_confirmed``) answers there the
fastest where it beats the entry's own config by more than ``margin`` (the margin a winner must clear
at export, 2 %: a new process times near-tied configs apart by about that much, so a near-tie keeps
the config the tuning runs chose), with a report.

A shape gives the dimensions the caller knows. A serving process knows its batch sizes (the sizes it
captures graphs at) but not the lengths its requests will reach: a dimension the shapes leave out is
confirmed cell by cell: the bundle's cells along it, cut to span at most ``cell_span`` each
(``tunectl.core.buckets.refined``), where the bundle has an entry. A cell is timed at its edges
(``cell_edges``: the points bounding it; one where it is open-ended), each point once with every
config the cells beside it need. The cell is then cut in parts, each with the candidate fastest at
its middle on the line between each one's times at the edges (``tunectl.measure.parts``); a part's
pick serves it along those dimensions (``with_confirmed(..., by_cell=...)``, the parts' points), at
the given values of the others. Where the cell's own entry keeps its place nothing is installed, so
a rule entry goes on computing its split count from each shape (and is timed with
its own count at each edge). ``settings`` say how a candidate is timed: the L2's state and the
timing method should be those the bundle's entries were measured with (the manifest's ``measured``;
``api.confirm_candidates`` reads them), or a warm-L2 ranking can disagree with the cold-L2 one the
bundle chose by. Within ``budget_s`` seconds: a shape not reached keeps the bundle's pick. A
candidate that fails to prepare or run, or whose output is wrong, is left out; a shape where none
ran keeps the pick.

    from tunectl.measure.confirm import confirm
    bundle, report = confirm(bundle, "flash_decode", static, [{"batch": b, "q_len": 1} for b in sizes],
                             budget_s=60, device="cuda")
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tunectl.core.buckets import refined, split_cells
from tunectl.core.files import canonical_json
from tunectl.core.spec import CELL_SPAN, DEFAULT_MARGIN, MeasureSpec
from tunectl.measure.parts import PARTS, Along, Part, Weighed, cell_parts, holds, on_lines, told_by_part
from tunectl.measure.side_by_side import DEFAULT_SETTINGS, time_configs
from tunectl.runtime import Bundle, Entry
from tunectl.tasks.base import TuningTask
from tunectl.tasks.registry import get_task

T = TypeVar("T")


@dataclass(frozen=True)
class ShapeReport:
    """One shape, or one cell standing for its shapes: the configs timed and their medians (µs; over
    a cell, the geometric mean of their medians at its edges; None: failed or wrong), the config
    installed at the shape (the bundle's pick where nothing was timed), the seconds spent, whether
    the budget ran out before it, each part's pick (``parts``: a cell's parts, module doc; the
    shape alone where nothing was left out), and each config's medians at the cell's points
    (``read``, in the order of ``at``)."""

    shape: Mapping[str, Any]
    timed: tuple[tuple[Mapping[str, Any], float | None], ...]
    chosen: Mapping[str, Any] | None
    seconds: float
    skipped: bool = False
    by_cell: tuple[str, ...] = ()  # the dimensions the shape stands for its cell along (module doc)
    at: tuple[str, ...] = ()  # where a cell was timed: its edges' values along ``by_cell``
    parts: tuple[Part, ...] = ()  # (the part's shape, the config installed there, its ranges)
    read: tuple[tuple[float, ...] | None, ...] = ()

    def line(self) -> str:
        shape = ", ".join(f"{k}={v}" for k, v in self.shape.items())
        if self.chosen is None:
            return f"{shape}: no entry of the bundle serves it"
        if self.by_cell:
            shape += f" (for its {', '.join(self.by_cell)} cell, timed at {' and '.join(self.at)})"
        if self.skipped:
            return f"{shape}: skipped (budget spent), the bundle's pick {dict(self.chosen)}"
        if not self.timed:
            return f"{shape}: one candidate, the bundle's pick {dict(self.chosen)}"
        times = "; ".join(f"{dict(c)} {self._told(i, t)}" for i, (c, t) in enumerate(self.timed))
        own = self.timed[0][1]
        if len({_text(config) for _, config, _ in self.parts}) > 1:
            return f"{shape}: chose {told_by_part(self.parts)} in {self.seconds:.2f} s ({times})"
        if (
            self.chosen == self.timed[0][0]
            and own is not None
            and any(t is not None and t < own for _, t in self.timed)
        ):
            kept = f"kept the bundle's pick {dict(self.chosen)}, no candidate faster beyond the margin"
            return f"{shape}: {kept}, in {self.seconds:.2f} s ({times})"
        return f"{shape}: chose {dict(self.chosen)} in {self.seconds:.2f} s ({times})"

    def _told(self, i: int, time: float | None) -> str:
        """The ``i``-th config's time; over a cell, with its medians at the points (``at``)."""
        if time is None:
            return "failed"
        at = self.read[i] if i < len(self.read) else None
        return f"{time:.1f} µs" + (f" ({' / '.join(f'{t:.1f}' for t in at)})" if at and len(at) > 1 else "")


@dataclass(frozen=True)
class _Cell:
    """One cell to confirm (one shape where nothing was left out): the shape standing for it (its
    middle), the entry's static key, where it is timed (its edges along the dimensions left out), the
    bundle's own config at each of those (a rule entry's count follows the shape), the list, and its
    parts: each one's shape, the weight of each edge's reading at its middle, and its ranges."""

    shape: dict[str, Any]
    static: dict[str, Any]
    samples: tuple[dict[str, Any], ...]
    own: tuple[dict[str, Any], ...]
    listed: tuple[dict[str, Any], ...]  # lookup's answer at ``shape`` first, then the other candidates
    parts: tuple[Weighed, ...]


def confirm(
    bundle: Bundle,
    task_name: str,
    static: Mapping[str, Any],
    shapes: Sequence[Mapping[str, Any]],
    *,
    budget_s: float,
    device: str = "cpu",
    mode: str = "eager",
    settings: MeasureSpec = DEFAULT_SETTINGS,
    margin: float = DEFAULT_MARGIN,
    cell_span: float = CELL_SPAN,
    reached: Sequence[Mapping[str, Any]] = (),
) -> tuple[Bundle, list[ShapeReport]]:
    """``bundle`` with the fastest candidate installed at each of ``shapes``, or over the cells of the
    dimensions they leave out, none spanning more than ``cell_span`` (module doc), and the report.
    Shapes and cells in ``reached`` (a run before this one confirmed them: ``reached_of``) are left
    out: neither timed nor reported."""
    grid, found = _found(bundle, task_name, static, shapes, cell_span)
    done = {_text(shape) for shape in reached}
    found = [c for c in found if not (isinstance(c, _Cell) and _text(c.shape) in done)]
    needs = _needs([c for c in found if isinstance(c, _Cell) and len(c.listed) > 1])
    times, spent = _time_points(get_task(task_name), needs, budget_s, (device, mode, settings))
    reports: list[ShapeReport] = []
    charged: set[str] = set()
    for cell in found:
        if not isinstance(cell, _Cell):
            reports.append(ShapeReport(cell, (), None, 0.0))
            continue
        at = tuple(", ".join(f"{d}={s[d]}" for d in grid) for s in cell.samples)
        keys = [_text(cell.static, s) for s in cell.samples]
        if len(cell.listed) < 2 or any(k not in spent for k in keys):
            skipped = len(cell.listed) > 1
            reports.append(ShapeReport(cell.shape, (), cell.listed[0], 0.0, skipped, tuple(grid), at))
            continue
        read = _readings(cell, keys, times)
        timed = tuple(
            (c, None if t is None else math.exp(math.fsum(map(math.log, t)) / len(t))) for c, t in read
        )
        seconds = sum(spent[k] for k in set(keys) - charged)  # a point two cells share, counted once
        charged.update(keys)
        parts = tuple((shape, installed(on_lines(read, w), margin), r) for shape, w, r in cell.parts)
        chosen = next((c for _, c, r in parts if holds(r, cell.shape)), parts[0][1])
        read_at = tuple(None if t is None else tuple(t) for _, t in read)
        reports.append(
            ShapeReport(cell.shape, timed, chosen, seconds, False, tuple(grid), at, parts, read_at)
        )
    picks = picks_of(static, reports)
    by_part = pick_grid(bundle, task_name, grid)
    return (bundle.with_confirmed(task_name, picks, by_cell=by_part) if picks else bundle), reports


def picks_of(
    static: Mapping[str, Any], reports: Sequence[ShapeReport]
) -> list[tuple[dict[str, Any], Mapping[str, Any]]]:
    """What confirming installs: (parameters, config) where a shape's or a cell part's pick is not the
    entry's own config (the first timed)."""
    return [
        ({**static, **shape}, config)
        for r in reports
        if r.timed
        for shape, config, _ in r.parts
        if config != r.timed[0][0]
    ]


def reached_of(reports: Sequence[ShapeReport]) -> list[dict[str, Any]]:
    """The shapes and cells ``reports`` confirmed (timed, or with one candidate): those a later run
    resuming this one leaves out. Not those the budget left, nor those no entry serves."""
    return [dict(r.shape) for r in reports if r.chosen is not None and not r.skipped]


@dataclass(frozen=True)
class Plan:
    """What confirming ``shapes`` would time (``plan``): the cells (or shapes) with a list of more than
    one config, the points they are timed at (two cells share an edge), the configs timed over all
    points, and the shapes or cells with one candidate or no entry (nothing to time)."""

    cells: int
    points: int
    timings: int
    single: int
    unserved: int

    def line(self) -> str:
        rest = f"; {self.single} with one candidate" if self.single else ""
        rest += f"; {self.unserved} without an entry" if self.unserved else ""
        return f"would time {self.timings} config(s) at {self.points} point(s) for {self.cells} cell(s){rest}"


def plan(
    bundle: Bundle,
    task_name: str,
    static: Mapping[str, Any],
    shapes: Sequence[Mapping[str, Any]],
    cell_span: float = CELL_SPAN,
) -> Plan:
    """What ``confirm`` would time for ``shapes``, timing nothing: to size its budget beforehand."""
    _, found = _found(bundle, task_name, static, shapes, cell_span)
    todo = [c for c in found if isinstance(c, _Cell) and len(c.listed) > 1]
    needs = _needs(todo)
    timings = sum(len(configs) for _, _, configs in needs.values())
    single = sum(1 for c in found if isinstance(c, _Cell) and len(c.listed) < 2)
    return Plan(len(todo), len(needs), timings, single, len(found) - len(todo) - single)


def _found(
    bundle: Bundle,
    task_name: str,
    static: Mapping[str, Any],
    shapes: Sequence[Mapping[str, Any]],
    span: float,
) -> tuple[dict[str, list[int]], list[_Cell | dict[str, Any]]]:
    """The grid along the dimensions ``shapes`` leave out, and the cells they reach (``cells``)."""
    grid = cell_grid(bundle, task_name, shapes, span)
    return grid, [cell for one in shapes for cell in cells(bundle, task_name, static, one, grid)]


def cell_grid(
    bundle: Bundle, task_name: str, shapes: Sequence[Mapping[str, Any]], span: float = CELL_SPAN
) -> dict[str, list[int]]:
    """The points of the cells confirmed along each dimension ``shapes`` leave out (module doc)."""
    given = set().union(*shapes) if shapes else set()
    dims = bundle.task_info(task_name)["shape_params"]
    return {d: refined(dims[d]["policy"], dims[d]["points"], span) for d in dims if d not in given}


def pick_grid(bundle: Bundle, task_name: str, grid: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    """The points of the cells' parts (module doc) along each dimension of ``grid`` (``cell_grid``):
    the cells confirmed picks serve."""
    dims = bundle.task_info(task_name)["shape_params"]
    return {d: split_cells(dims[d]["policy"], points, PARTS) for d, points in grid.items()}


def cells(
    bundle: Bundle,
    task_name: str,
    static: Mapping[str, Any],
    given: Mapping[str, Any],
    grid: Mapping[str, Sequence[int]],
) -> list[_Cell | dict[str, Any]]:
    """The cells ``given`` reaches along each dimension of ``grid`` (its cells among the grid's points,
    under the dimension's policy) where the bundle has an entry; ``given`` alone as one cell where the
    grid is empty; ``given`` itself (a shape no entry serves, which the report says) where none has."""
    dims = bundle.task_info(task_name)["shape_params"]
    along = [[Along.of(dims[d]["policy"], points, p) for p in points] for d, points in grid.items()]
    out: list[_Cell | dict[str, Any]] = []
    for combo in itertools.product(*along):
        shape = {**given, **{d: a.middle for d, a in zip(grid, combo, strict=True)}}
        entry = bundle.entry(task_name, **static, **shape)
        if entry is None:
            continue
        listed = bundle.candidates(task_name, **static, **shape)
        corners = list(itertools.product(*(a.edges for a in combo)))
        samples = tuple({**given, **dict(zip(grid, values, strict=True))} for values in corners)
        own = tuple(served_at(entry, listed[0], {**static, **s}) for s in samples)
        parts = cell_parts(given, list(grid), combo, corners)
        out.append(_Cell(shape, dict(entry.static), samples, own, tuple(listed), parts))
    return out or [dict(given)]


def served_at(entry: Entry, answer: dict[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """What ``entry`` serves at ``params`` (``answer``: lookup's answer somewhere in its cell): its
    config, or a rule entry's with the count for them."""
    return answer if entry.rule is None else entry.rule.config(answer, params)


def _text(*parts: Mapping[str, Any]) -> str:
    """A canonical text of ``parts``: a point's (its static key and shape), or a config's."""
    return canonical_json([dict(part) for part in parts], default=str)


_Needs = dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Mapping[str, Any]]]]


def _needs(todo: Sequence[_Cell]) -> _Needs:
    """Every config the cells need at each of their points, by point: its static key, its shape, the
    configs by their text (a point two cells share, once)."""
    needs: _Needs = {}
    for cell in todo:
        for sample, own in zip(cell.samples, cell.own, strict=True):
            _, _, configs = needs.setdefault(_text(cell.static, sample), (cell.static, sample, {}))
            configs.update({_text(c): c for c in (own, *cell.listed[1:])})
    return needs


def _time_points(
    task: TuningTask, needs: _Needs, budget_s: float, how: tuple[str, str, MeasureSpec]
) -> tuple[dict[tuple[str, str], float | None], dict[str, float]]:
    """Each point's configs timed together in one interleaved session; the times by (point, config),
    and the seconds each point took. Points not reached within ``budget_s`` are left out."""
    device, mode, settings = how
    start = time.perf_counter()
    times: dict[tuple[str, str], float | None] = {}
    spent: dict[str, float] = {}
    for point, (static, sample, configs) in needs.items():
        if time.perf_counter() - start >= budget_s:
            break
        t0 = time.perf_counter()
        got = time_configs(
            task, static, sample, list(configs.values()), device=device, mode=mode, settings=settings
        )
        times.update({(point, key): t for key, t in zip(configs, got, strict=True)})
        spent[point] = time.perf_counter() - t0
    return times, spent


def _readings(
    cell: _Cell, keys: Sequence[str], times: Mapping[tuple[str, str], float | None]
) -> list[tuple[Mapping[str, Any], list[float] | None]]:
    """Each listed config's times at the cell's points (the entry's own config at each point as it
    serves there); None where one of them failed."""
    out: list[tuple[Mapping[str, Any], list[float] | None]] = []
    for i, config in enumerate(cell.listed):
        at = [times[(k, _text(own if i == 0 else config))] for k, own in zip(keys, cell.own, strict=True)]
        ok = [t for t in at if t is not None and t > 0]
        out.append((config, ok if len(ok) == len(at) else None))
    return out


def installed(timed: Sequence[tuple[T, float | None]], margin: float) -> T:
    """Of one shape's timed candidates (the entry's own config first; None: not timed), the one
    confirming installs: the fastest that ran, unless the entry's own config ran and none beat it by
    more than ``margin``."""
    ran = [(t, i) for i, (_, t) in enumerate(timed) if t is not None]
    own = timed[0][1]
    if not ran or (own is not None and min(ran)[0] * (1.0 + margin) >= own):
        return timed[0][0]
    return timed[min(ran)[1]][0]
