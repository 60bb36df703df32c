"""Confirm a bundle's candidates at the shapes a serving process will run (``tunectl bundle confirm``):
what start-up confirming would choose at those shapes and how long it takes on this machine."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunectl.core.errors import OptionError
from tunectl.core.spec import CELL_SPAN, DEFAULT_MARGIN, MeasureSpec
from tunectl.runtime import Bundle

if TYPE_CHECKING:
    from tunectl.measure.confirm import Plan, ShapeReport


@dataclass(frozen=True)
class ConfirmOptions:
    """``static``: the entries' static values to confirm for (needed only where the bundle holds more
    than one static key of the task); ``device``: ``auto`` (the first GPU, else the CPU) or a device;
    ``budget_s``: seconds for every shape together (a shape not reached keeps the bundle's pick);
    ``margin``: how much faster than the entry's own config a candidate must be to replace it;
    ``cell_span``: the widest a cell confirmed along a dimension the shapes leave out may span."""

    static: Mapping[str, Any] = field(default_factory=dict)
    device: str = "auto"
    budget_s: float = 60.0
    margin: float = DEFAULT_MARGIN
    cell_span: float = CELL_SPAN


@dataclass(frozen=True)
class Confirmed:
    bundle: Bundle  # answers the confirmed configs at the confirmed shapes (and cells)
    static: dict[str, Any]
    device: str
    reports: list[ShapeReport]
    how: str = ""  # how a candidate was timed: mode, L2 state, timing method
    task: str = ""
    #: what confirming installed: (parameters, config), and the cells of the dimensions left out
    picks: list[tuple[dict[str, Any], Mapping[str, Any]]] = field(default_factory=list)
    by_cell: dict[str, list[int]] = field(default_factory=dict)
    #: the shapes and cells confirmed, by this run and the one it resumed (``confirm_candidates``)
    reached: list[dict[str, Any]] = field(default_factory=list)
    resumed: int = 0  # of them, those the run it resumed had confirmed

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.reports)


def save_confirmed(done: Confirmed, bundle: Bundle, path: str | os.PathLike[str]) -> Path:
    """Write what ``done`` confirmed for ``bundle`` to ``path``, for ``tunectl.runtime.apply_confirmed``
    to apply in serving processes without timing anything (``tunectl.runtime.confirmed``)."""
    from tunectl.runtime.confirmed import save_confirmed as save

    try:
        not_reached = sum(r.skipped for r in done.reports)
        return save(path, bundle, done.task, done.picks, done.by_cell, done.how, not_reached, done.reached)
    except OSError as exc:
        raise OptionError("save", os.fspath(path), f"cannot be written: {exc.strerror or exc}") from exc


def shape_grid(values: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the values given per shape dimension, in the order given."""
    names = list(values)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*values.values())]


def confirm_candidates(
    bundle: Bundle,
    task: str,
    shapes: Sequence[Mapping[str, Any]],
    options: ConfirmOptions | None = None,
    resume: str | os.PathLike[str] | None = None,
) -> Confirmed:
    """Time each shape's candidates through the task, fastest installed (``tunectl.measure.confirm``).
    A dimension the shapes leave out (the lengths a serving process cannot know) is confirmed cell by
    cell along it, and a pick there serves its cell. ``resume``: confirmed picks saved for this bundle
    by an earlier run (``save_confirmed``), where it exists: what that run reached is not timed again,
    and its picks are kept beside this run's (a confirmation cut short by its budget goes on where it
    stopped)."""
    from tunectl.measure.confirm import cell_grid, confirm, pick_grid, picks_of, reached_of
    from tunectl.measure.timing import timing_of

    options = options or ConfirmOptions()
    static = _checked(bundle, task, shapes, options)
    grid = pick_grid(bundle, task, cell_grid(bundle, task, list(shapes), options.cell_span))
    before = _saved(bundle, task, grid, resume)
    device = _device(options.device)
    mode, settings = timed_as(bundle, task, device)
    _, reports = confirm(
        bundle,
        task,
        static,
        list(shapes),
        budget_s=options.budget_s,
        device=device,
        mode=mode,
        settings=settings,
        margin=options.margin,
        cell_span=options.cell_span,
        reached=before["reached"],
    )
    how = f"{mode}, {settings.l2} L2, {timing_of(device, str(settings.l2), str(settings.timing))} timing"
    picks = [*before["picks"], *picks_of(static, reports)]
    confirmed = bundle.with_confirmed(task, picks, by_cell=grid) if picks else bundle
    reached, resumed = [*before["reached"], *reached_of(reports)], len(before["reached"])
    return Confirmed(confirmed, static, device, reports, how, task, picks, grid, reached, resumed)


def _saved(
    bundle: Bundle, task: str, grid: Mapping[str, list[int]], path: str | os.PathLike[str] | None
) -> dict[str, Any]:
    """What the confirmed picks at ``path`` hold for ``task`` ("picks" as (parameters, config), and
    "reached"); nothing where there is no file there. Raises where the file is not for this bundle
    (``tunectl.runtime.confirmed.read_confirmed``), or for other cells than ``grid``'s."""
    from tunectl.runtime.confirmed import read_confirmed

    if path is None or not Path(path).exists():
        return {"picks": [], "reached": []}
    doc = read_confirmed(bundle, path)
    why = ""
    if doc["task"] != task:
        why = f"holds picks confirmed for task {doc['task']!r}, not {task!r}"
    elif doc["by_cell"] != dict(grid):
        why = (
            "holds picks confirmed by other cells (another --cell-span, other dimensions left out, or"
            " whole cells by an earlier tunectl)"
        )
    if why:
        raise OptionError("save", os.fspath(path), f"{why}: remove it to confirm from the start")
    return {"picks": [(p["params"], p["config"]) for p in doc["picks"]], "reached": doc["reached"]}


def plan_confirm(
    bundle: Bundle, task: str, shapes: Sequence[Mapping[str, Any]], options: ConfirmOptions | None = None
) -> Plan:
    """What ``confirm_candidates`` would time for ``shapes`` (cells, points, configs), timing nothing."""
    from tunectl.measure.confirm import plan

    options = options or ConfirmOptions()
    static = _checked(bundle, task, shapes, options)
    return plan(bundle, task, static, list(shapes), options.cell_span)


def _checked(
    bundle: Bundle, task: str, shapes: Sequence[Mapping[str, Any]], options: ConfirmOptions
) -> dict[str, Any]:
    """The static key ``options`` select for ``task``, once the options and shapes are checked."""
    if not options.cell_span > 1:
        raise OptionError("cell_span", options.cell_span, "must be more than 1 (a factor)")
    if not 0 <= options.budget_s < math.inf:
        raise OptionError("budget_s", options.budget_s, "must be 0 seconds or more")
    if not 0 <= options.margin < math.inf:
        raise OptionError("margin", options.margin, "must be 0 or more (a fraction: 0.02 is 2 %)")
    if bad := [f"{d}={v}" for shape in shapes for d, v in shape.items() if type(v) is not int or v < 1]:
        raise OptionError("shape", bad[0], f"{bad[0]}: must give whole numbers of 1 or more")
    if task not in bundle.tasks:
        raise OptionError("task", task, f"must be a task of the bundle ({', '.join(bundle.tasks) or 'none'})")
    dims = list(bundle.task_info(task)["shape_params"])
    if unknown := sorted({d for shape in shapes for d in shape} - set(dims)):
        raise OptionError("shape", unknown, f"must name shape dimensions of {task}: {', '.join(dims)}")
    if len({frozenset(shape) for shape in shapes}) > 1:
        raise OptionError("shape", "", "every shape must give the same dimensions")
    return _static_of(bundle, task, options.static)


def timed_as(bundle: Bundle, task: str, device: str) -> tuple[str, MeasureSpec]:
    """How confirming times a candidate: as the bundle's entries were measured (its manifest's
    ``measured``: L2 state, mode, timing method), else the task's serving mode with a warm L2; eager
    where ``device`` is not a GPU."""
    from tunectl.measure.side_by_side import DEFAULT_SETTINGS

    measured = (bundle.manifest.get("tasks", {}).get(task) or {}).get("measured") or {}
    mode = str(measured.get("mode") or _serving_mode(task)) if device.startswith("cuda") else "eager"
    if mode not in ("eager", "graph"):
        mode = _serving_mode(task)
    how = {k: measured[k] for k in ("l2", "timing") if isinstance(measured.get(k), str)}
    try:
        return mode, dataclasses.replace(DEFAULT_SETTINGS, **how)
    except (TypeError, ValueError):  # a value this version does not know: time as the default does
        return mode, DEFAULT_SETTINGS


def _static_of(bundle: Bundle, task: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The one static key of ``task``'s entries that agrees with ``given``."""
    statics = {tuple(sorted(dict(e.static).items())) for e in bundle.entries(task)}
    matching = [dict(s) for s in statics if all(dict(s).get(k) == v for k, v in given.items())]
    if len(matching) != 1:
        reason = f"must match one static key of {task}'s entries; {len(matching)} of {len(statics)} match"
        raise OptionError("static", dict(given), reason)
    return matching[0]


def _device(device: str) -> str:
    from tunectl.tasks.compile import build_device

    return build_device(0) if device == "auto" else device


def _serving_mode(task: str) -> str:
    from tunectl.core.registry import get_task

    return str(get_task(task).serving_mode)
