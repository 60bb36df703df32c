"""Probes: a cell's config chosen over the region it serves, measured inside it, not only at its point.

A bundle entry serves a region (with ``ceil``, every size above the tuned value below it, up to its
own), but its config was chosen at one point: a round size at the region's edge. Between points a
winner can fall off a cliff. A kernel that fills the GPU's SMs exactly at batch 16 leaves a second
wave almost empty at 17; a split-KV kernel whose splits fill one wave of programs at 8192 tokens
overflows into a second at 7847 (the Triton default at batch 5, page 128: fastest at 8192, 11-15 %
slower at 7847-7890 on the H200). On the H200's decode grids the point's winner was more than 3 %
slower than the best config at about one held-out shape in five (``benchmarks/results/holdout_h200.md``).

Probing measures, in each cell of a tuning run's grid (the product of the values it tuned per
dimension, per static key), ``per_cell`` shapes spread over the region the cell serves: dimension
by dimension, one per equal slice of the region in log size (the slices paired across dimensions
in a Latin square, so two probes never share a slice), rounded to the dimension's ``step``. A
dimension without a declared range is not varied. Each probe is one comparison, interleaved on one
device, of the default and a short list: the winners of the tuned points at the corners of the box
around the region (with ``ceil``: the cell's point and the tuned values below it) and the cell's
``shortlist`` fastest configs (where it has no result of its own: the nearest tuned point's), and the
count of each split rule whose family is on that list (``tunectl.decide.rules``). On the H200's decode
grids a config within 3 % of the best was on that list at 210 of 216 held-out shapes.

``regional`` then serves each probed cell the config whose worst loss over the cell's sites (each
probe, and the tuned point itself: a config's time there over the fastest config's) is least.
The cell's own entry keeps its place where its worst loss is within the margin of that least one,
and the default next; a config the probes did not measure everywhere is not chosen.

``tunectl probe RUN`` probes a finished run as a run of its own. With ``[search] probes = n`` the
tuning run probes itself (``tunectl.decide.inline_probes``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tunectl.core.buckets import Bucketer, make_bucketer
from tunectl.core.keys import Key, key_text, make_key, value_order
from tunectl.core.plan import RunFacts, WorkItem, comparison
from tunectl.core.record import Phase, Record, latest
from tunectl.core.shapes import ShapeDim
from tunectl.core.spec import Spec
from tunectl.decide.coverage import nearest, sizes
from tunectl.decide.rules import Fitted, Timings, fit_rules, probe_losses
from tunectl.decide.select import Winner, fidelity, is_timing, latest_comparisons, select_winners
from tunectl.decide.stacked import Skipped

DEFAULT_PER_CELL = 2
DEFAULT_SHORTLIST = 4

CheckPoint = Callable[[Key, Key], "str | None"]  # (static, shape) -> why the task cannot run it, or None


def region(bucket: Bucketer, value: int, span: tuple[int, int]) -> tuple[int, int]:
    """The sizes inside ``span`` (lo, hi; both included) that ``bucket`` maps to ``value``. Every policy
    maps a larger size to the same point or a larger one, so they form one interval around ``value``."""
    lo, hi = span
    if not lo <= value <= hi:
        return (value, value)
    a, b = lo, value  # the smallest size bucketing to value lies in [a, b]
    while a < b:
        mid = (a + b) // 2
        a, b = (a, mid) if bucket(mid) == value else (mid + 1, b)
    first = a
    a, b = value, hi  # the largest in [a, b]
    while a < b:
        mid = (a + b + 1) // 2
        a, b = (mid, b) if bucket(mid) == value else (a, mid - 1)
    return (first, a)


def spread(lo: int, hi: int, step: int, fraction: float) -> int:
    """The multiple of ``step`` in [lo, hi] nearest the size ``fraction`` of the way from lo to hi in
    log size; ``hi`` where no multiple of the step lies in it."""
    first, last = -(-lo // step) * step, hi // step * step
    if first > last:
        return hi
    at = math.exp(math.log(lo) + fraction * (math.log(hi) - math.log(lo)))
    return min(last, max(first, round(at / step) * step))


def probe_shapes(
    cell: Key, regions: Mapping[str, tuple[int, int]], steps: Mapping[str, int], n: int
) -> list[Key]:
    """``n`` shapes inside the region of ``cell`` (``regions``: each varied dimension's sizes), one per
    slice of each dimension: the first dimension's slices in order, the second's reversed, a third's
    turned by one (a Latin square); the cell's own shape and repeats left out."""
    varied = [d for d in regions if regions[d][0] < regions[d][1]]
    out: dict[Key, None] = {}
    for i in range(n):
        values = dict(cell)
        for j, dim in enumerate(varied):
            turn = (n - 1 - i) if j % 2 else (i + j // 2) % n
            values[dim] = spread(*regions[dim], steps.get(dim, 1), (turn + 0.5) / n)
        shape = make_key(values)
        if shape != cell:
            out[shape] = None
    return list(out)


@dataclass(frozen=True)
class ProbePlan:
    items: tuple[WorkItem, ...]
    skipped: tuple[Skipped, ...]
    cells: int  # cells that have at least one probe


def plan_probes(
    task: str,
    dims: Sequence[ShapeDim],
    bucketers: Mapping[str, Callable[[Sequence[int]], Bucketer]],
    winners: Sequence[Winner],
    timings: Timings,
    default_of: Callable[[Key], Key],
    check_point: CheckPoint,
    *,
    per_cell: int = DEFAULT_PER_CELL,
    shortlist: int = DEFAULT_SHORTLIST,
    rounds: int,
    rules: Sequence[Fitted] = (),
) -> ProbePlan:
    """The probe comparisons of every cell of ``winners``' grid (one tuning run's winners of ``task``).

    ``bucketers``: per dimension, the bucketer of its policy over given points; ``timings``: each tuned
    point's single-timing medians (``point_timings``); ``default_of``: a static key's default config;
    ``rules``: fitted split rules, whose count at a probe joins it where its family is on the list.
    """
    items: list[WorkItem] = []
    skipped: list[Skipped] = []
    cells = 0
    spans = {d.name: d.range for d in dims if d.range is not None}
    steps = {d.name: d.step for d in dims}
    for static in sorted({w.static for w in winners if w.task == task}, key=value_order):
        tuned = {w.shape: w for w in winners if w.task == task and w.static == static}
        names = [name for name, _ in next(iter(tuned))]
        values = {n: sorted({sizes(s)[n] for s in tuned}) for n in names}
        buckets = {n: bucketers[n](values[n]) for n in spans if n in values}
        for combo in itertools.product(*(values[n] for n in names)):
            cell = make_key(dict(zip(names, combo, strict=True)))
            regions = {n: region(buckets[n], sizes(cell)[n], spans[n]) for n in buckets}
            corners = _corners(cell, regions, values)
            arms = _arms(task, static, cell, corners, tuned, timings, default_of(static), shortlist)
            mine = 0
            for shape in probe_shapes(cell, regions, steps, per_cell):
                why = check_point(static, shape)
                if why is not None:
                    skipped.append(Skipped(static, shape, why))
                    continue
                ruled = [f.pick(shape) for f in rules if f.static == static and any(map(f.holds, arms))]
                mine_arms = tuple(dict.fromkeys([*arms, *ruled]))
                items.append(comparison(task, static, shape, mine_arms, Phase.PROBE, rounds))
                mine += 1
            cells += mine > 0
    return ProbePlan(tuple(items), tuple(skipped), cells)


def probes_of(
    spec: Spec,
    records: Sequence[Record],
    selectable: Callable[[str, Key, Key], bool],
    default_of: Callable[[Key], Key],
    check_point: CheckPoint,
    *,
    per_cell: int,
    shortlist: int,
    rounds: int,
    facts: RunFacts | None = None,
) -> ProbePlan:
    """The probes of a tuning run's finished ``records`` (its measurements and finals) under its spec;
    with the run's ``facts``, each probe also measures the split rules fitted to them."""
    winners = select_winners(records, selectable=selectable, margin=spec.select.margin)
    bucketers = {d.name: functools.partial(make_bucketer, d.bucket) for d in spec.shapes}
    timings = point_timings(records, selectable)
    rules = fit_rules(timings, [facts]) if facts is not None else []
    return plan_probes(
        spec.task,
        spec.shapes,
        bucketers,
        winners,
        timings,
        default_of,
        check_point,
        per_cell=per_cell,
        shortlist=shortlist,
        rounds=rounds,
        rules=rules,
    )


def _corners(cell: Key, regions: Mapping[str, tuple[int, int]], values: Mapping[str, list[int]]) -> list[Key]:
    """The corners of the box of tuned values around ``cell``'s region: per dimension, the cell's
    value and, where the region reaches past it, the tuned value beyond on that side."""
    sides = []
    for name, value in sizes(cell).items():
        lo, hi = regions.get(name, (value, value))
        tuned = values.get(name, [])
        below = [v for v in tuned if v < value and lo < value][-1:]
        above = [v for v in tuned if v > value and hi > value][:1]
        sides.append([(name, v) for v in (value, *below, *above)])
    return [make_key(dict(corner)) for corner in itertools.product(*sides)]


def _arms(
    task: str,
    static: Key,
    cell: Key,
    corners: Sequence[Key],
    tuned: Mapping[Key, Winner],
    timings: Timings,
    default: Key,
    k: int,
) -> tuple[Key, ...]:
    """The default, the winners of the tuned points at the corners around the region (the cell's
    first), and the ``k`` fastest at the cell (where it has no result of its own: at the nearest
    tuned point, whose winner joins them)."""
    closest = cell if cell in tuned else nearest(cell, list(tuned))
    times = timings.get((task, static, closest), {})
    fastest = sorted(times, key=lambda c: (times[c], value_order(c)))[:k]
    won = [tuned[s].config for s in (*corners, closest) if s in tuned]
    return tuple(dict.fromkeys([default, *won, *fastest]))


def point_timings(records: Iterable[Record], selectable: Callable[[str, Key, Key], bool]) -> Timings:
    """Per (task, static, shape), each selectable config's single-timing median: a full measurement
    over a screening look, then the later one (``tunectl.decide.select.fidelity``)."""
    timed = [r for r in records if is_timing(r) and selectable(r.task, r.static, r.config)]
    best = latest(timed, lambda r: (r.task, r.static, r.shape, r.config), fidelity)
    out: dict[tuple[str, Key, Key], dict[Key, float]] = {}
    for (task, static, shape, config), record in best.items():
        out.setdefault((task, static, shape), {})[config] = float(record.median_us or 0.0)
    return out


@dataclass(frozen=True)
class Site:
    """One place a cell was measured: each config's time over the fastest config's there."""

    losses: Mapping[Key, float]
    arms: tuple[Record, ...] = ()  # a probe's comparison (empty: the tuned point's single timings)


def regional(
    winners: Sequence[Winner],
    probes: Iterable[Record],
    timings: Timings,
    bucketers: Mapping[str, Mapping[str, Bucketer]],
    margin: float,
) -> list[Winner]:
    """``winners`` with each probed cell's config chosen over its region (module doc).

    ``bucketers``: per task, each shape dimension's bucketer over the bundle's points: a probe serves
    the cell its shape buckets to. Cells without probes are left as they are."""
    sites: dict[tuple[str, Key, Key], list[Site]] = {}
    for arms in latest_comparisons(probes, Phase.PROBE).values():
        first, losses = arms[0], probe_losses(arms)
        cell = cell_of(first.shape, bucketers.get(first.task, {}))
        site = None if losses is None else Site(losses, tuple(r for r in arms if r.config in losses))
        if cell is not None and site is not None:
            sites.setdefault((first.task, first.static, cell), []).append(site)
    out = []
    for w in winners:
        found = sites.get((w.task, w.static, w.shape))
        times = timings.get((w.task, w.static, w.shape)) if w.served_by is None else None
        if found and times:
            fastest = min(times.values())
            found = [*found, Site({c: t / fastest for c, t in times.items()})]
        out.append(_choose(w, found, margin) if found else w)
    return out


def cell_of(shape: Key, bucketers: Mapping[str, Bucketer]) -> Key | None:
    values = {}
    for name, value in shape:
        point = bucketers[name](value) if name in bucketers else value
        if point is None:
            return None
        values[name] = point
    return make_key(values)


def _choose(w: Winner, sites: Sequence[Site], margin: float) -> Winner:
    """``w`` or the config with the least worst loss over ``sites`` (module doc), the choice noted."""
    common = set.intersection(*(set(s.losses) for s in sites))
    if not common:
        return w
    worst = {c: max(s.losses[c] for s in sites) for c in common}
    least = min(worst.values())
    default = next((r.config for s in sites for r in s.arms if r.is_default), None)
    keep = [c for c in (w.config, default) if c in worst and worst[c] <= least * (1 + margin)]
    counted = f"{len(sites)} site(s), {sum(1 for s in sites if s.arms)} probe(s)"
    if keep and keep[0] == w.config:
        return dataclasses.replace(
            w, region=f"held over the region: worst loss {worst[w.config] - 1:.1%} at {counted}"
        )
    choice = keep[0] if keep else min(common, key=lambda c: (worst[c], value_order(c)))
    was = f"{worst[w.config] - 1:.1%}" if w.config in worst else "not measured at every probe"
    note = (
        f"least worst loss over the region: {worst[choice] - 1:.1%} at {counted} "
        f"(the point's choice {key_text(w.config)}: {was})"
    )
    return _replaced(w, choice, sites, note)


def _replaced(w: Winner, config: Key, sites: Sequence[Site], note: str) -> Winner:
    """``w`` serving ``config``: its statistics from the probes (paired speedups over the default,
    their geometric mean and range; the median probe's timing)."""
    mine = sorted((r for s in sites for r in s.arms if r.config == config), key=lambda r: r.median_us or 0.0)
    speedups = [1.0 if r.is_default else float(r.speedup or 0.0) for r in mine]
    middle = mine[len(mine) // 2]
    is_default = middle.is_default
    return dataclasses.replace(
        w,
        config=config,
        is_default=is_default,
        median_us=float(middle.median_us or 0.0),
        p20_us=float(middle.p20_us or 0.0),
        p80_us=float(middle.p80_us or 0.0),
        rel_noise=float(middle.rel_noise or 0.0),
        num_samples=sum(r.num_samples or 0 for r in mine),
        speedup=math.exp(sum(map(math.log, speedups)) / len(speedups)),
        speedup_lo=min(speedups),
        speedup_hi=max(speedups),
        basis="region",
        rounds=sum(r.rounds or 0 for r in mine),
        near_ties=0,
        tie_by="",
        region=note,
    )
