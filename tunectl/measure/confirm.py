"""Confirm a bundle's candidates at a serving process's own shapes, at start-up.

A bundle entry serves a region with one config chosen at its tuned point; between tuned points
another config can be faster. Export gives each entry a short ranked list of configs measured
around its cell (``Bundle.candidates``, ``tunectl.decide.candidates``). ``confirm`` times each
candidate at each shape the caller will run, through the task's own path (inputs, reference,
``prepare``, output check) and the project's samplers (``tunectl.measure.timing``), in ``ROUNDS``
interleaved rounds (``tunectl.measure.harness.interleave``: a slowdown meanwhile falls on every
candidate alike), and returns a bundle whose ``lookup`` (``Bundle.with_confirmed``) answers there the
fastest where it beats the entry's own config by more than ``margin`` (the margin a winner must clear
at export, 2 %: a new process times near-tied configs apart by about that much, so a near-tie keeps
the config the tuning runs chose), with a report.

A shape gives the dimensions the caller knows. A serving process knows its batch sizes (the sizes it
captures graphs at) but not the lengths its requests will reach: a dimension the shapes leave out is
confirmed cell by cell: the bundle's cells along it, cut to span at most ``cell_span`` each
(``tunectl.core.buckets.refined``), each timed at its middle (``cell_middle``) where the bundle has
an entry, and a pick made there serves its whole cell along that dimension (``with_confirmed(...,
by_cell=...)``), at the given values of the others. Where the cell's own entry keeps its place
nothing is installed, so a rule entry goes on computing its split count from each shape.
``settings`` say how a candidate is timed: the L2's state and the timing method should be those the
bundle's entries were measured with (the manifest's ``measured``; ``api.confirm_candidates`` reads
them), or a warm-L2 ranking can disagree with the cold-L2 one the bundle chose by. Within
``budget_s`` seconds: a shape not reached keeps the bundle's pick. A candidate that fails to prepare
or run, or whose output is wrong, is left out; a shape where none ran keeps the pick.

    from tunectl.measure.confirm import confirm
    bundle, report = confirm(bundle, "flash_decode", static, [{"batch": b, "q_len": 1} for b in sizes],
                             budget_s=60, device="cuda")
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tunectl.core.buckets import cell_middle, refined
from tunectl.core.spec import CELL_SPAN, DEFAULT_MARGIN, MeasureSpec
from tunectl.measure.harness import Sampler, interleave
from tunectl.measure.rounds import round_times
from tunectl.measure.timing import make_sampler
from tunectl.runtime import Bundle
from tunectl.tasks.base import TuningTask, compare_outputs
from tunectl.tasks.registry import get_task

T = TypeVar("T")
#: rounds a shape's candidates are timed in, each round in a fresh random order
ROUNDS = 4
#: each candidate's timing: short, since a list is a handful of configs per shape at start-up
DEFAULT_SETTINGS = MeasureSpec(warmup=2, min_samples=10, max_samples=200, noise_target=0.02, max_seconds=0.2)


@dataclass(frozen=True)
class ShapeReport:
    """One shape: the configs timed and their medians (µs; None: failed or wrong), the config
    installed (the bundle's pick where nothing was timed), the seconds spent, and whether the budget
    ran out before it."""

    shape: Mapping[str, Any]
    timed: tuple[tuple[Mapping[str, Any], float | None], ...]
    chosen: Mapping[str, Any] | None
    seconds: float
    skipped: bool = False
    by_cell: tuple[str, ...] = ()  # the dimensions the shape stands for its cell along (module doc)

    def line(self) -> str:
        shape = ", ".join(f"{k}={v}" for k, v in self.shape.items())
        if self.chosen is None:
            return f"{shape}: no entry of the bundle serves it"
        if self.by_cell:
            shape += f" (for its {', '.join(self.by_cell)} cell)"
        if self.skipped:
            return f"{shape}: skipped (budget spent), the bundle's pick {dict(self.chosen)}"
        if not self.timed:
            return f"{shape}: one candidate, the bundle's pick {dict(self.chosen)}"
        times = "; ".join(f"{dict(c)} {'failed' if t is None else f'{t:.1f} µs'}" for c, t in self.timed)
        own = self.timed[0][1]
        if (
            self.chosen == self.timed[0][0]
            and own is not None
            and any(t is not None and t < own for _, t in self.timed)
        ):
            kept = f"kept the bundle's pick {dict(self.chosen)}, no candidate faster beyond the margin"
            return f"{shape}: {kept}, in {self.seconds:.2f} s ({times})"
        return f"{shape}: chose {dict(self.chosen)} in {self.seconds:.2f} s ({times})"


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
) -> tuple[Bundle, list[ShapeReport]]:
    """``bundle`` with the fastest candidate installed at each of ``shapes``, or over the cells of the
    dimensions they leave out, none spanning more than ``cell_span`` (module doc), and the report."""
    task = get_task(task_name)
    given = set().union(*shapes) if shapes else set()
    dims = bundle.task_info(task_name)["shape_params"]
    grid = {d: refined(dims[d]["policy"], dims[d]["points"], cell_span) for d in dims if d not in given}
    free = tuple(grid)
    start = time.perf_counter()
    reports: list[ShapeReport] = []
    picks: list[tuple[dict[str, Any], Mapping[str, Any]]] = []
    for shape in (cell for one in shapes for cell in cells(bundle, task_name, static, one, grid)):
        params = {**static, **shape}
        listed = bundle.candidates(task_name, **params)
        if time.perf_counter() - start >= budget_s:
            chosen = listed[0] if listed else None
            reports.append(ShapeReport(shape, (), chosen, 0.0, skipped=True, by_cell=free))
            continue
        report = _confirm_shape(
            bundle, task, task_name, params, shape, listed, (device, mode, settings), margin
        )
        reports.append(dataclasses.replace(report, by_cell=free))
        if report.timed and report.chosen is not None and report.chosen != listed[0]:
            picks.append((params, report.chosen))
    return (bundle.with_confirmed(task_name, picks, by_cell=grid) if picks else bundle), reports


def cells(
    bundle: Bundle,
    task_name: str,
    static: Mapping[str, Any],
    given: Mapping[str, Any],
    grid: Mapping[str, Sequence[int]],
) -> list[dict[str, Any]]:
    """``given`` completed along each dimension of ``grid`` with the middle of each of its cells
    among the grid's points (under the dimension's policy) where the bundle has an entry; ``given``
    alone where the grid is empty or no cell has one (a shape no entry serves, which the report says)."""
    dims = bundle.task_info(task_name)["shape_params"]
    middles = [[cell_middle(dims[d]["policy"], points, p) for p in points] for d, points in grid.items()]
    shapes = [{**given, **dict(zip(grid, values, strict=True))} for values in itertools.product(*middles)]
    served = [s for s in shapes if bundle.entry(task_name, **static, **s) is not None]
    return served if grid and served else [dict(given)]


def _confirm_shape(
    bundle: Bundle,
    task: TuningTask,
    task_name: str,
    params: Mapping[str, Any],
    shape: dict[str, Any],
    listed: list[dict[str, Any]],
    how: tuple[str, str, MeasureSpec],
    margin: float,
) -> ShapeReport:
    """Time each of ``listed`` at one shape; the fastest that ran and matched the reference, unless the
    entry's own config (listed first) ran and none beat it by more than ``margin``."""
    t0 = time.perf_counter()
    entry = bundle.entry(task_name, **params)
    if entry is None or len(listed) < 2:
        return ShapeReport(shape, (), listed[0] if listed else None, 0.0)
    device, mode, settings = how
    times = time_configs(task, dict(entry.static), shape, listed, device=device, mode=mode, settings=settings)
    timed = tuple(zip(listed, times, strict=True))
    return ShapeReport(shape, timed, installed(timed, margin), time.perf_counter() - t0)


def installed(timed: Sequence[tuple[T, float | None]], margin: float) -> T:
    """Of one shape's timed candidates (the entry's own config first; None: not timed), the one
    confirming installs: the fastest that ran, unless the entry's own config ran and none beat it by
    more than ``margin``."""
    ran = [(t, i) for i, (_, t) in enumerate(timed) if t is not None]
    own = timed[0][1]
    if not ran or (own is not None and min(ran)[0] * (1.0 + margin) >= own):
        return timed[0][0]
    return timed[min(ran)[1]][0]


def time_configs(
    task: TuningTask,
    static: dict[str, Any],
    shape: dict[str, Any],
    configs: Sequence[Mapping[str, Any]],
    *,
    device: str = "cpu",
    mode: str = "eager",
    settings: MeasureSpec = DEFAULT_SETTINGS,
) -> list[float | None]:
    """Each of ``configs`` timed at one shape (µs, the median over ``ROUNDS`` interleaved rounds) on
    fresh inputs, through the task's own path and output check; None where a config fails to run, its
    output is wrong, or its time could not be taken."""
    inputs = task.build_inputs(static, shape, device)
    reference = task.reference(static, shape, inputs)
    how = (device, mode, settings)
    samplers = [_sampler(task, static, shape, config, inputs, reference, how) for config in configs]
    found = iter(_interleaved([s for s in samplers if s is not None], settings))
    return [None if s is None else next(found) for s in samplers]


def _sampler(
    task: TuningTask,
    static: dict[str, Any],
    shape: dict[str, Any],
    config: Mapping[str, Any],
    inputs: Any,
    reference: Any,
    how: tuple[str, str, MeasureSpec],
) -> Sampler | None:
    """One candidate's sampler at the shape; None where it fails to run or its output is wrong."""
    device, mode, settings = how
    try:
        fn = task.prepare(static, shape, task.complete_config(dict(config)), inputs)
        _, ok = compare_outputs(fn(), reference, *task.tolerance(static))
        return make_sampler(fn, device, mode, str(settings.l2), str(settings.timing)) if ok else None
    except Exception:  # a candidate that cannot run here is left out, as tuning leaves it out
        return None


def _interleaved(samplers: list[Sampler], settings: MeasureSpec) -> list[float | None]:
    """Each sampler's time (µs): the median over ``ROUNDS`` interleaved rounds, each round in a fresh
    order, so that a slowdown while confirming falls on every candidate alike; None where a
    candidate's time could not be taken."""
    if not samplers:
        return []
    try:
        per_round = round_times(interleave(samplers, ROUNDS, settings, seed=0), 0)
    except Exception:  # a sampler that fails mid-way (or a time lost in the flush): none is trusted
        return [None] * len(samplers)
    return [statistics.median(times) for times in per_round]
