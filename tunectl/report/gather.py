"""What the report shows, as plain data: result records and a bundle in, ``ReportData`` out.

This is the one module that reads result records; drawing and the page see only the dataclasses
here, so a change in what a record holds touches this file alone.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tunectl.core import stats
from tunectl.core.keys import Key, value_order
from tunectl.core.record import Phase, Record
from tunectl.decide.quality import noise_known
from tunectl.decide.select import Winner, latest_comparisons, select_winners
from tunectl.report.drift import DriftPanel, drift_panel
from tunectl.report.grids import Cell, Grid, Group, Point, label, noise_grid, short_labels, speedup_grids
from tunectl.report.worker_time import WorkerTime, worker_times

if TYPE_CHECKING:
    from tunectl.runtime import Bundle, Entry


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

    @property
    def verdict(self) -> str:
        """faster / slower (the whole 95 % interval past 1), tie, or the status of a failed check."""
        if self.status != "ok" or self.speedup is None or self.lo is None or self.hi is None:
            return self.status if self.status != "ok" else "no interval"
        s = stats.Speedup(self.speedup, self.lo, self.hi, self.rounds or 0)
        return "faster" if s.beats() else "slower" if s.loses() else "tie"


@dataclass(frozen=True)
class ValidationPanel:
    group: Group
    checks: tuple[Check, ...]
    plot: str  # "" when no check has a speedup to draw

    @property
    def geomean(self) -> float | None:
        return geomean(c.speedup for c in self.checks if c.status == "ok")


@dataclass(frozen=True)
class Choice:
    config: Key
    median_us: float | None  # None: the choice failed


@dataclass(frozen=True)
class ImportedPoint:
    """One shape of an imported autotuning log: Inductor's pick (its fastest choice) and the rest."""

    shape: Key
    choices: tuple[Choice, ...]  # fastest first, failed last

    @property
    def pick(self) -> Choice | None:
        return self.choices[0] if self.choices and self.choices[0].median_us is not None else None

    def over_pick(self, choice: Choice) -> float | None:
        """How many times slower than the pick ``choice`` ran (None where it failed)."""
        pick = self.pick
        if pick is None or pick.median_us is None or choice.median_us is None:
            return None
        return choice.median_us / pick.median_us

    @property
    def num_failed(self) -> int:
        return sum(c.median_us is None for c in self.choices)

    @property
    def runner_up(self) -> Choice | None:
        ok = [c for c in self.choices if c.median_us is not None]
        return ok[1] if len(ok) > 1 else None

    @property
    def slowest(self) -> Choice | None:
        ok = [c for c in self.choices if c.median_us is not None]
        return ok[-1] if len(ok) > 1 else None

    @property
    def fallback(self) -> Choice | None:
        """The choice that is not a generated kernel (Inductor logs its fallback as type ``extern``)."""
        return next((c for c in self.choices if dict(c.config).get("type") == "extern"), None)


@dataclass(frozen=True)
class ImportedPanel:
    group: Group
    points: tuple[ImportedPoint, ...]
    plot: str
    names: Mapping[Key, str]  # each choice by the options that vary among the group's choices

    def name(self, choice: Choice | None) -> str:
        return self.names.get(choice.config, label(choice.config)) if choice is not None else "none finished"


@dataclass(frozen=True)
class BundleSection:
    name: str  # name/version
    location: str
    points: tuple[Point, ...]
    panels: tuple[SpeedupPanel, ...]  # the groups whose entries are not the results' winners
    repeated: tuple[Group, ...] = ()  # groups whose entries are the winners above, speedups and all


@dataclass(frozen=True)
class ReportData:
    runs: Mapping[str, int]  # run -> rows
    statuses: Mapping[str, int]
    phases: Mapping[str, int]
    points: tuple[Point, ...]
    speedup: tuple[SpeedupPanel, ...]
    noise: tuple[Grid, ...]
    validation: tuple[ValidationPanel, ...]
    imported: tuple[ImportedPanel, ...]
    bundle: BundleSection | None
    drift: DriftPanel | None = None  # each worker's drift-guard reference over its life
    time: tuple[tuple[str, WorkerTime], ...] = ()  # (run, where a worker's time went), per run and worker

    @property
    def grids(self) -> tuple[Grid, ...]:
        bundle_panels = self.bundle.panels if self.bundle else ()
        return (*(g for p in (*self.speedup, *bundle_panels) for g in p.grids), *self.noise)


def geomean(values: Iterable[float | None]) -> float | None:
    """Geometric mean of the positive values; None where there are none."""
    positive = [v for v in values if v is not None and v > 0]
    return stats.geomean(positive) if positive else None


# -- reading records: the only place that knows a record's fields -----------------------------------


def _group(row: Record) -> Group:
    return Group(row.task, row.device_name or "", row.static)


def _cell_keys(row: Record) -> tuple[Key, Key]:
    return row.shape, row.config


def _noise_cell(row: Record) -> Cell:
    shape, config = _cell_keys(row)
    status = str(row.status)
    if not row.ok:
        message = (row.message or "").strip().splitlines()
        note = f"{status}: {message[0][:200]}" if message else status
        return Cell(None, status.replace("_result", ""), note, status, shape, config)
    noise, median, phase = row.rel_noise, row.median_us, str(row.phase)
    note = f"median {median:,.1f} µs ({phase})" if median is not None else phase
    if noise is not None and not noise_known(row):  # one sample: no spread to speak of
        return Cell(None, "?", f"{note}; one sample, its noise unknown", "ok", shape, config)
    return Cell(noise, f"{noise:.1%}" if noise is not None else "-", note, "ok", shape, config)


def _check(row: Record) -> Check:
    shape, config = _cell_keys(row)
    interval = row.speedup, row.speedup_lo, row.speedup_hi
    return Check(shape, config, str(row.status), *interval, row.layers, row.rounds, row.message or "")


def _choice(row: Record) -> Choice:
    return Choice(row.config, row.median_us if row.ok and row.median_us is not None else None)


def _latest(rows: Iterable[Record]) -> list[Record]:
    """The last finished record per (task, device, static, shape, config)."""
    latest: dict[tuple[Any, ...], Record] = {}
    for row in rows:
        at = (row.task, row.device_name, row.static_key, row.shape_key, row.config_key)
        if at not in latest or (row.finished_at or 0.0) >= (latest[at].finished_at or 0.0):
            latest[at] = row
    return list(latest.values())


def _compared_arms(rows: Iterable[Record]) -> list[Record]:
    """Per shape, the arms of its latest validation that are not the default (the default's arm where it
    was compared with itself alone)."""
    chosen: list[Record] = []
    for arms in latest_comparisons(rows, Phase.VALIDATE).values():
        chosen += [r for r in arms if not r.is_default] or list(arms)
    return chosen


def _defaults(rows: Iterable[Record]) -> set[Key]:
    return {r.config for r in rows if r.is_default}


# -- from rows and a bundle to panels ---------------------------------------------------------------


def by_group(items: Iterable[Any], group_of: Callable[[Any], Group]) -> dict[Group, list[Any]]:
    groups: dict[Group, list[Any]] = {}
    for item in items:
        groups.setdefault(group_of(item), []).append(item)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0].task, kv[0].device, value_order(kv[0].static))))


def point_of_winner(winner: Winner) -> Point:
    lo, hi = winner.speedup_lo, winner.speedup_hi
    return Point(
        Group(winner.task, winner.device_name, winner.static),
        winner.shape,
        winner.config,
        winner.is_default,
        winner.speedup,
        winner.median_us,
        winner.default_median_us,
        (lo, hi) if lo is not None and hi is not None else None,
        winner.reason,
    )


def bundle_points(bundle: Bundle) -> tuple[Point, ...]:
    """Every entry of ``bundle`` as a point, its speedup from the bundle's statistics."""
    device = str(bundle.manifest.get("environment", {}).get("device_name", ""))
    return tuple(point_of_entry(task, device, e) for task in bundle.tasks for e in bundle.entries(task))


def point_of_entry(task: str, device: str, entry: Entry) -> Point:
    """A bundle entry as a point; its speedup from the medians where the bundle records none."""
    median, default, speedup = entry.median_us, entry.default_median_us, entry.speedup
    if speedup is None and median and default:
        speedup = default / median
    lo, hi = entry.speedup_lo, entry.speedup_hi
    return Point(
        Group(task, device, entry.static),
        entry.shape,
        entry.config,
        entry.is_default,
        speedup,
        median,
        default,
        (lo, hi) if lo is not None and hi is not None else None,
        entry.reason,
    )


def bundle_section(bundle: Bundle, winners: Sequence[Point]) -> BundleSection:
    """``bundle``'s entries, and a heatmap per group whose entries differ from ``winners`` (the
    results'); a group whose entries are those winners with the same speedups is not drawn again."""
    entries = bundle_points(bundle)
    repeated = _same_groups(entries, winners)
    shown = speedup_panels([p for p in entries if p.group not in repeated], "bundle")
    name = f"{bundle.name}/{bundle.version}"
    return BundleSection(
        name, bundle.location, entries, shown, tuple(g for g in _groups(entries) if g in repeated)
    )


def _same_groups(entries: Sequence[Point], winners: Sequence[Point]) -> set[Group]:
    """The groups where ``entries`` and ``winners`` choose the same configs with the same speedups."""

    def table(points: Iterable[Point]) -> dict[Group, dict[Key, tuple[Key, float | None]]]:
        out: dict[Group, dict[Key, tuple[Key, float | None]]] = {}
        for p in points:
            out.setdefault(p.group, {})[p.shape] = (
                p.config,
                None if p.speedup is None else round(p.speedup, 6),
            )
        return out

    theirs = table(winners)
    return {group for group, mine in table(entries).items() if theirs.get(group) == mine}


def _groups(points: Iterable[Point]) -> list[Group]:
    return list(by_group(points, lambda p: p.group))


def speedup_panels(points: Iterable[Point], plot_prefix: str) -> tuple[SpeedupPanel, ...]:
    panels: list[SpeedupPanel] = []
    for group, members in by_group(points, lambda p: p.group).items():
        ordered = sorted(members, key=lambda p: value_order(p.shape))
        first = sum(len(p.grids) for p in panels) + 1
        panels.append(SpeedupPanel(group, speedup_grids(ordered, plot_prefix, first), tuple(ordered)))
    return tuple(panels)


def validation_panels(rows: Iterable[Record]) -> tuple[ValidationPanel, ...]:
    """Per group, each shape's latest validation: its config's arm against the default."""
    panels = []
    for n, (group, members) in enumerate(by_group(_compared_arms(rows), _group).items(), start=1):
        checks = tuple(sorted(map(_check, members), key=lambda c: value_order(c.shape)))
        drawable = any(c.status == "ok" and c.speedup is not None for c in checks)
        panels.append(ValidationPanel(group, checks, f"validation-{n:03d}.png" if drawable else ""))
    return tuple(panels)


def imported_panels(rows: Iterable[Record]) -> tuple[ImportedPanel, ...]:
    """Per group of imported rows (another tuner's log): each shape's choices, its pick first."""
    panels = []
    for n, (group, members) in enumerate(by_group(_latest(rows), _group).items(), start=1):
        shapes: dict[Key, list[Choice]] = {}
        for row in members:
            shapes.setdefault(_cell_keys(row)[0], []).append(_choice(row))
        points = tuple(
            ImportedPoint(shape, tuple(sorted(choices, key=_choice_order)))
            for shape, choices in sorted(shapes.items(), key=lambda kv: value_order(kv[0]))
        )
        names = short_labels(c.config for p in points for c in p.choices)
        panels.append(ImportedPanel(group, points, f"imported-{n:03d}.png", names))
    return tuple(panels)


def _choice_order(choice: Choice) -> tuple[float, tuple[Any, ...]]:
    return (math.inf if choice.median_us is None else choice.median_us, value_order(choice.config))


def gather(rows: Sequence[Record], bundle: Bundle | None = None) -> ReportData:
    """What the report shows, from result records (and a loaded bundle)."""
    imported = [r for r in rows if r.phase is Phase.IMPORT]
    measured = [r for r in rows if r.phase not in (Phase.VALIDATE, Phase.IMPORT)]
    points = tuple(point_of_winner(w) for w in select_winners(measured))
    noise = tuple(
        noise_grid(
            group, [_noise_cell(r) for r in members], f"noise-{n:03d}.png", defaults=_defaults(members)
        )
        for n, (group, members) in enumerate(by_group(_latest(measured), _group).items(), start=1)
    )
    return ReportData(
        runs=dict(sorted(Counter(r.run_id for r in rows).items())),
        statuses=dict(Counter(str(r.status) for r in rows).most_common()),
        phases=dict(Counter(str(r.phase) for r in rows).most_common()),
        points=points,
        speedup=speedup_panels(points, "speedup"),
        noise=noise,
        validation=validation_panels(rows),
        imported=imported_panels(imported),
        bundle=None if bundle is None else bundle_section(bundle, points),
        drift=drift_panel(measured),
        time=tuple((run, w) for run, mine in by_run(rows).items() for w in worker_times(mine)),
    )


def by_run(rows: Iterable[Record]) -> dict[str, list[Record]]:
    """The rows of each run, runs in order of their ids (which begin with their start time)."""
    out: dict[str, list[Record]] = {}
    for r in rows:
        out.setdefault(r.run_id, []).append(r)
    return dict(sorted(out.items()))


__all__ = ["ReportData", "gather", "label"]
