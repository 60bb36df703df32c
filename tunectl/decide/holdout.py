"""Held-out validation: how a bundle's picks do at shapes nobody tuned.

``N`` shapes are drawn inside the spec's declared ranges (log-uniform, rounded to each dimension's
``step``; a dimension without a range takes one of its values), leaving out shapes the bundle's
choices were measured at (its tuned points, and its source runs' refined points and probes). At
each, for each static key, one item times the default, the bundle's pick and every selectable
config of the spec in interleaved rounds on one device (``WorkItem`` phase ``holdout``, single
calls as serving makes them). The fastest of them is the oracle; pick / oracle is the pick's
time over the oracle's (1.0: the pick was the best there). The bundle fails the check when the pick
is slower than the oracle by more than the margin at more than 5 % of the shapes.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tunectl.core.keys import Key, key_text, make_key, value_order
from tunectl.core.plan import WorkItem, comparison, configs_of, full_config
from tunectl.core.record import Phase, Record
from tunectl.core.registry import PlannedTask
from tunectl.core.shapes import ShapeDim
from tunectl.core.spec import DEFAULT_MARGIN, Spec
from tunectl.decide.select import latest_comparisons
from tunectl.decide.stacked import Skipped

#: the share of held-out shapes the pick may lose at (beyond the margin) before the check fails
MAX_LOSING_SHARE = 0.05
Picks = dict[tuple[str, str], Key]  # (static key text, shape key text) -> the config serving would run


def draw_shapes(spec: Spec, num_shapes: int, seed: int, tuned: Iterable[Key] = ()) -> list[Key]:
    """Up to ``num_shapes`` distinct shapes inside the spec's ranges, none of them ``tuned``; the same
    ``seed`` draws the same shapes. Fewer where the ranges hold fewer untuned shapes."""
    if not spec.ranges():
        raise ValueError("held-out shapes need a dimension that declares a range")
    rng = random.Random(seed)
    seen = set(tuned)
    shapes: list[Key] = []
    for _ in range(num_shapes * 100):
        if len(shapes) == num_shapes:
            break
        shape = make_key({d.name: _draw(rng, d) for d in spec.shapes})
        if shape not in seen:
            seen.add(shape)
            shapes.append(shape)
    return shapes


def _draw(rng: random.Random, dim: ShapeDim) -> int:
    if dim.range is None:
        return rng.choice(dim.values)
    lo, hi = dim.range
    value = round(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    value = round(value / dim.step) * dim.step
    if value < lo:  # rounded below the range: the next multiple of the step up
        value += math.ceil((lo - value) / dim.step) * dim.step
    return min(hi, value)


def plan_holdout(
    spec: Spec, bundle: object, shapes: Iterable[Key], *, rounds: int, task: PlannedTask
) -> tuple[list[WorkItem], Picks, list[Skipped]]:
    """One comparison item per (static key, shape): the default, the bundle's pick (the default where
    the bundle has no entry: that is what serving runs), every selectable config of the spec, and the
    bundle's candidates there (a split a rule gives at that shape is none of the spec's configs; timed,
    whatever confirming at start-up would choose can be scored)."""
    items: list[WorkItem] = []
    picks: Picks = {}
    skipped: list[Skipped] = []
    shapes = list(shapes)
    for static in spec.static_grid():
        default, configs = configs_of(task, static, spec.configs, spec.default)
        selectable = [c for c in configs if task.selectable(dict(static), dict(c))]
        for shape in shapes:
            why = task.check_point(dict(static), dict(shape))
            if why is not None:
                skipped.append(Skipped(static, shape, why))
                continue
            found = bundle.lookup(spec.task, **dict(static), **dict(shape))  # type: ignore[attr-defined]
            pick = full_config(task, found) if found is not None else default
            baselines = [config for _, config in baselines_of(spec, task)]
            listed = [full_config(task, c) for c in _candidates(bundle, spec.task, static, shape)]
            arms = tuple(dict.fromkeys([default, pick, *baselines, *selectable, *listed]))
            items.append(comparison(spec.task, static, shape, arms, Phase.HOLDOUT, rounds))
            picks[(key_text(static), key_text(shape))] = pick
    return items, picks, skipped


def _candidates(bundle: object, task: str, static: Key, shape: Key) -> list[dict[str, object]]:
    """The bundle's candidates at a shape (none where it lists none, or cannot: an older bundle)."""
    listed = getattr(bundle, "candidates", None)
    return list(listed(task, **dict(static), **dict(shape))) if callable(listed) else []


@dataclass(frozen=True)
class HeldOut:
    """One held-out (static key, shape): the pick, the fastest config there, and pick / oracle."""

    static: Key
    shape: Key
    pick: Key
    oracle: Key | None
    ratio: float | None  # the pick's time over the oracle's; None where the comparison failed
    status: str = "ok"
    losses: Mapping[Key, float] = field(default_factory=dict)  # each config's time over the oracle's
    default: Key | None = None

    def loses(self, margin: float) -> bool:
        return self.ratio is not None and self.ratio > 1.0 + margin


@dataclass(frozen=True)
class Standing:
    """How one way of choosing did over the held-out shapes: its time over the oracle's."""

    label: str
    ratios: tuple[float, ...]

    @property
    def geomean(self) -> float | None:
        return statistics.geometric_mean(self.ratios) if self.ratios else None

    @property
    def within_3pct(self) -> float | None:
        """The share of shapes within 3 % of the oracle."""
        return sum(r <= 1.03 for r in self.ratios) / len(self.ratios) if self.ratios else None

    @property
    def worst(self) -> float | None:
        return max(self.ratios) if self.ratios else None


@dataclass(frozen=True)
class Holdout:
    shapes: tuple[HeldOut, ...]
    margin: float = DEFAULT_MARGIN
    baselines: tuple[tuple[str, Key], ...] = ()  # the spec's [baselines], completed

    def standings(self) -> list[Standing]:
        """The picks, the default, each baseline and the best single config, over the compared shapes."""
        compared = [h for h in self.shapes if h.ratio is not None]
        out = [
            Standing("the bundle's pick", tuple(h.ratio for h in compared if h.ratio is not None)),
            Standing(
                "the default", tuple(h.losses[d] for h in compared if (d := h.default) and d in h.losses)
            ),
        ]
        for label, config in self.baselines:
            out.append(Standing(label, tuple(h.losses[config] for h in compared if config in h.losses)))
        everywhere = set.intersection(*(set(h.losses) for h in compared)) if compared else set()
        ranked = sorted(
            (
                Standing(f"best single config {key_text(c)}", tuple(h.losses[c] for h in compared))
                for c in everywhere
            ),
            key=lambda st: (st.geomean or 0.0, st.label),
        )
        return out + ranked[:1]

    @property
    def ratios(self) -> list[float]:
        return sorted(s.ratio for s in self.shapes if s.ratio is not None)

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile of pick / oracle (nearest rank)."""
        ratios = self.ratios
        return ratios[min(len(ratios) - 1, math.ceil(q * len(ratios)) - 1)] if ratios else None

    @property
    def geomean(self) -> float | None:
        ratios = self.ratios
        return statistics.geometric_mean(ratios) if ratios else None

    @property
    def losers(self) -> list[HeldOut]:
        return [s for s in self.shapes if s.loses(self.margin)]

    @property
    def failed(self) -> bool:
        """The pick loses beyond the margin at more than ``MAX_LOSING_SHARE`` of the measured shapes."""
        measured = len(self.ratios)
        return measured > 0 and len(self.losers) > MAX_LOSING_SHARE * measured


def baselines_of(spec: Spec, task: PlannedTask) -> tuple[tuple[str, Key], ...]:
    """The spec's ``[baselines]`` (label, config), each config completed as the arms are."""
    return tuple((label, full_config(task, dict(config))) for label, config in spec.baselines)


def read_holdout(
    records: Iterable[Record],
    picks: Mapping[tuple[str, str], Key],
    margin: float,
    baselines: tuple[tuple[str, Key], ...] = (),
) -> Holdout:
    """The verdict per held-out point from a holdout run's records."""
    found = latest_comparisons(records, Phase.HOLDOUT)
    out = []
    for arms in found.values():
        pick = picks.get((arms[0].static_key, arms[0].shape_key))
        if pick is not None:
            out.append(_held_out(arms, pick))
    ordered = tuple(sorted(out, key=lambda h: (value_order(h.static), value_order(h.shape))))
    return Holdout(ordered, margin, baselines)


def _held_out(arms: list[Record], pick: Key) -> HeldOut:
    static, shape = arms[0].static, arms[0].shape
    default = next((r for r in arms if r.is_default), None)
    mine = next((r for r in arms if r.config == pick), None)
    if default is None or mine is None or not default.ok or not mine.ok:
        failed = next((r for r in (default, mine) if r is not None and not r.ok), None)
        return HeldOut(static, shape, pick, None, None, str(failed.status) if failed else "missing")

    def speedup(r: Record) -> float:
        return 1.0 if r.is_default else (r.speedup or 0.0)

    best = max((r for r in arms if r.ok), key=lambda r: (speedup(r), r.is_default))
    losses = {r.config: speedup(best) / speedup(r) for r in arms if r.ok and speedup(r) > 0}
    return HeldOut(
        static, shape, pick, best.config, speedup(best) / speedup(mine), "ok", losses, default.config
    )
