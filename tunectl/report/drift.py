"""The drift section of the report: each worker's drift-guard reference (``tunectl.measure.drift``)
over its life, as plain data.

Every guarded measurement row carries the reference's median that judged it (``reference_us``); one
worker's rows in time order are that worker's life: a reference that climbs is a device that slowed
(a power cap, a clock, a neighbour). Per worker the report draws the reference over its first
reading against minutes since the run's first reading, marks the rows whose guard saw a shift, and
tabulates the range with the SM clocks and throttling read beside it.

Per worker it also counts the configs whose looks at one point read far apart with no flag
(``tunectl.decide.quality.looks_apart``): a slowdown the reference did not move for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tunectl.core.record import Record
from tunectl.decide.quality import looks_apart
from tunectl.report.grids import PAGE_WIDTH_IN

PLOT = "drift-001.png"


@dataclass(frozen=True)
class ReferenceReading:
    at_s: float  # seconds since the first reading in the report
    reference_us: float
    drift: bool  # the guard saw the reference move beyond noise at the row's kept measurement
    remeasured: int
    sm_clock_mhz: float | None
    throttled: bool | None


@dataclass(frozen=True)
class WorkerDrift:
    worker: str  # host:pid
    device: str
    readings: tuple[ReferenceReading, ...]  # in time order
    #: configs whose looks at a point read far apart (``looks_apart``), of those it looked at twice
    looks: tuple[int, int] = (0, 0)

    @property
    def first_us(self) -> float:
        return self.readings[0].reference_us

    @property
    def range_us(self) -> tuple[float, float]:
        values = [r.reference_us for r in self.readings]
        return min(values), max(values)

    @property
    def largest_shift(self) -> float:
        """The reading furthest from the first, as a ratio to it (1.0: never moved)."""
        return max((r.reference_us / self.first_us for r in self.readings), key=lambda x: abs(x - 1.0))

    @property
    def num_drift(self) -> int:
        return sum(r.drift for r in self.readings)

    @property
    def num_remeasured(self) -> int:
        return sum(r.remeasured for r in self.readings)

    @property
    def clock_range(self) -> tuple[float, float] | None:
        clocks = [r.sm_clock_mhz for r in self.readings if r.sm_clock_mhz is not None]
        return (min(clocks), max(clocks)) if clocks else None

    @property
    def num_throttled(self) -> int:
        return sum(bool(r.throttled) for r in self.readings)


@dataclass(frozen=True)
class DriftPanel:
    workers: tuple[WorkerDrift, ...]
    plot: str


def drift_panel(rows: Iterable[Record]) -> DriftPanel | None:
    """Per worker, its guarded records' reference readings in time order; None where none timed the
    reference."""
    rows = list(rows)
    guarded = [r for r in rows if r.reference_us is not None and r.worker]
    if not guarded:
        return None
    start = min(r.finished_at or 0.0 for r in guarded)
    by_worker: dict[tuple[str, str], list[ReferenceReading]] = {}
    for row in sorted(guarded, key=lambda r: r.finished_at or 0.0):
        reading = ReferenceReading(
            at_s=(row.finished_at or 0.0) - start,
            reference_us=float(row.reference_us or 0.0),
            drift=bool(row.drift),
            remeasured=int(row.remeasured or 0),
            sm_clock_mhz=row.sm_clock_mhz,
            throttled=row.throttled,
        )
        by_worker.setdefault((str(row.worker), str(row.device_name or "")), []).append(reading)
    ordered = sorted(by_worker.items())
    looks = looks_apart(rows)
    workers = tuple(
        WorkerDrift(worker, device, tuple(readings), looks.get(worker, (0, 0)))
        for (worker, device), readings in ordered
    )
    return DriftPanel(workers, PLOT)


def draw_drift(panel: DriftPanel, path: Any) -> None:
    """One line per worker: its reference over its first reading against minutes; shifts marked ×."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(PAGE_WIDTH_IN, 3.6), layout="constrained")
    ax = fig.add_subplot()
    for worker in panel.workers:
        x = [r.at_s / 60 for r in worker.readings]
        y = [r.reference_us / worker.first_us for r in worker.readings]
        (line,) = ax.plot(x, y, marker=".", ms=3, lw=1, label=f"{worker.worker} ({worker.device or 'cpu'})")
        seen = zip(x, y, worker.readings, strict=True)
        flagged = [(xi, yi) for xi, yi, r in seen if r.drift or r.remeasured]
        if flagged:
            xs, ys = zip(*flagged, strict=True)
            ax.scatter(xs, ys, marker="x", s=40, color=line.get_color(), zorder=3)
    ax.axhline(1.0, color="grey", lw=1)
    ax.set_xlabel("minutes since the first reading")
    ax.set_ylabel("reference time over the worker's first (×)")
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path, dpi=100)
