"""Stacked validation: does a bundle beat the untuned defaults where it counts, inside a model?

A per-call winner can lose end to end (its cache and register footprint hurts the layers around it),
so each point of a spec is run as a stack of L layers, a cache-thrashing kernel between calls, with
the bundle's config and with the default, interleaved on one device (``WorkItem`` phase
``validate``). This module plans those items and reads their rows back into a verdict; the runs
themselves go through the orchestrator like any other (``tunectl.api.checks``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tunectl.core.keys import Key, key_from_text, key_text, value_order
from tunectl.core.plan import WorkItem, comparison, default_of, full_config
from tunectl.core.record import Phase, Record
from tunectl.core.registry import PlannedTask, get_task
from tunectl.core.spec import Spec
from tunectl.core.stats import Speedup, geomean_speedup
from tunectl.decide.select import latest_comparisons

DEFAULT_LAYERS = 36
DEFAULT_ROUNDS = 8


@dataclass(frozen=True)
class Skipped:
    static: Key
    shape: Key
    why: str


def plan_validation(
    spec: Spec,
    bundle: Any,
    *,
    layers: int = DEFAULT_LAYERS,
    rounds: int = DEFAULT_ROUNDS,
    task: PlannedTask | None = None,
) -> tuple[list[WorkItem], list[Skipped]]:
    """One item per point of ``spec`` where ``bundle`` chose a config other than the default.

    ``task``: the spec's task (default: the registered one).
    """
    if layers < 1 or rounds < 2:
        raise ValueError("need at least 1 layer and 2 rounds")
    task = task or get_task(spec.task)
    items: list[WorkItem] = []
    skipped: list[Skipped] = []
    for static in spec.static_grid():
        default = default_of(task, static, spec.default)
        for shape in spec.shape_grid():
            why = task.check_point(dict(static), dict(shape))
            found = bundle.lookup(spec.task, **dict(static), **dict(shape)) if why is None else None
            config = full_config(task, found) if found is not None else None
            if why is None and config is None:
                why = "the bundle has no entry here"
            if why is None and config == default:
                why = "the bundle keeps the default here"
            if why is not None or config is None:
                skipped.append(Skipped(static, shape, why or ""))
                continue
            arms = (default, config)
            items.append(comparison(spec.task, static, shape, arms, Phase.VALIDATE, rounds, layers))
    return items, skipped


@dataclass(frozen=True)
class PointVerdict:
    static: Key
    shape: Key
    config: Key  # the bundle's
    status: str  # ok, or why the comparison failed
    default_us: float | None  # per layer, net of the thrash kernels (median over rounds)
    bundle_us: float | None
    speedup: Speedup | None
    message: str = ""

    @property
    def verdict(self) -> str:
        if self.speedup is None:
            return self.status
        if self.speedup.loses():
            return "slower"
        return "faster" if self.speedup.beats() else "tie"


@dataclass(frozen=True)
class Validation:
    points: tuple[PointVerdict, ...]
    layers: int
    rounds: int

    @property
    def geomean(self) -> Speedup | None:
        measured = [p.speedup for p in self.points if p.speedup is not None]
        return geomean_speedup(measured) if measured else None

    @property
    def losers(self) -> list[PointVerdict]:
        """Points where the bundle is slower than the defaults beyond noise."""
        return [p for p in self.points if p.verdict == "slower"]

    @property
    def failures(self) -> list[PointVerdict]:
        return [p for p in self.points if p.speedup is None]


def read_validation(records: Iterable[Record]) -> Validation:
    """The verdict per point from a validation run's records (the latest comparison at each point)."""
    latest = latest_comparisons(records, Phase.VALIDATE)
    order = sorted(latest, key=lambda at: (at[0], at[1], at[2], value_order(key_from_text(at[3]))))
    points = [_verdict(latest[at]) for at in order]
    layers = max((r.layers or 0 for g in latest.values() for r in g), default=0)
    rounds = max((r.rounds or 0 for g in latest.values() for r in g), default=0)
    return Validation(tuple(points), layers, rounds)


def _verdict(group: list[Record]) -> PointVerdict:
    default = next(r for r in group if r.is_default)
    bundle = next((r for r in group if not r.is_default), default)
    ok = default.ok and bundle.ok
    speedup = None
    if ok and bundle.speedup is not None and bundle.rounds is not None:
        speedup = Speedup(bundle.speedup, bundle.speedup_lo, bundle.speedup_hi, bundle.rounds)  # type: ignore[arg-type]
    failed = bundle if not bundle.ok else default
    return PointVerdict(
        default.static,
        default.shape,
        bundle.config,
        "ok" if ok else str(failed.status),
        default.median_us if ok else None,
        bundle.median_us if ok else None,
        speedup,
        "" if ok else failed.message,
    )


def describe_point(point: PointVerdict) -> str:
    return f"{key_text(point.shape)} ({key_text(point.static)})"
