"""Refinement: more shape points where neighbouring tuned points disagree.

A spec dimension that declares ``range = [lo, hi]`` is tuned at its starting ``values`` first. Once
every point of a static key is finished (its finals too), refinement looks along one refined
dimension at a time, the others fixed, at each pair of neighbouring points: where their winners
differ, or where one config wins at both but its speedup intervals over the default do not overlap
(the advantage changed by more than the noise), it plans the midpoint, rounded to the dimension's
``step`` (batch 24 between 16 and 32; kv 3072 between 2048 and 4096 with ``step = 512``). The new
points are measured like the starting ones (by the spec's strategy, grid or halving, and finals),
and the next level is planned once they finish, until neighbours agree, no midpoint is left, or
``[search] refine_budget`` extra points of that static key were planned.

With ``[search] refine_shortlist = k`` a refined point measures only the default and, of each tuned
point next to it (the nearest below and above along each refined dimension, the others fixed), the
``k`` configs with the lowest single-timing median there (the record selection counts, ``fidelity``).
Between tuned points the best config is nearly always among its neighbours' few fastest (on the
H200's decode grids, 24 of 24 held-out shapes at page 128 and 23 of 24 at page 16 had a config within
3 % of the best among the 3 fastest at the points around it: ``benchmarks/results/holdout_h200.md``),
so a refined point costs a few configs' measurements instead of every config's, and a budget buys
several times the points.

It is a layer over ``tunectl.decide.search.Search``, not a strategy of its own: a strategy decides how one
point's configs are measured, refinement decides which points exist, so it composes with grid and
halving alike. Every decision is a function of records already written (each level is planned from
finished points only, in a fixed order), so a resumed run plans the same extra points, and the
search asks only for their missing items: one row per item, whatever stopped the run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from tunectl.core.keys import Key, make_key, value_order
from tunectl.core.plan import Plan, WorkItem
from tunectl.core.record import Record, latest
from tunectl.core.shapes import ShapeDim, line_neighbours
from tunectl.core.spec import DEFAULT_MARGIN
from tunectl.decide.coverage import sizes
from tunectl.decide.points import Point
from tunectl.decide.search import Search
from tunectl.decide.select import Winner, fidelity, is_timing, select_winners

CheckPoint = Callable[[Key, Key], "str | None"]  # (static, shape) -> why the task cannot run it, or None


def midpoint(lo: int, hi: int, step: int = 1) -> int | None:
    """The multiple of ``step`` nearest the middle of ``lo`` and ``hi``, if it lies strictly between."""
    mid = ((lo + hi) // 2 + step // 2) // step * step
    return mid if lo < mid < hi else None


def advantage(winner: Winner) -> tuple[float, float]:
    """The winner's speedup interval over the default; (1, 1) where the default itself won."""
    if winner.is_default or winner.speedup is None:
        return (1.0, 1.0)
    lo = winner.speedup_lo if winner.speedup_lo is not None else winner.speedup
    hi = winner.speedup_hi if winner.speedup_hi is not None else winner.speedup
    return (lo, hi)


def disagree(a: Winner, b: Winner) -> bool:
    """Different winners, or one winner whose advantage changed by more than the noise."""
    if a.config != b.config:
        return True
    (a_lo, a_hi), (b_lo, b_hi) = advantage(a), advantage(b)
    return a_hi < b_lo or b_hi < a_lo


def candidates(
    winners: Mapping[Key, Winner | None],
    known: Iterable[Key],
    dims: Sequence[ShapeDim],
    infeasible: Iterable[Key] = (),
) -> list[Key]:
    """Midpoints between neighbouring shapes (along one of ``dims`` at a time, the others fixed) that
    disagree, not already ``known``, in a fixed order (by dimension, then value).

    Breakpoints come first: where the winners differ, or a point has a winner and its neighbour
    cannot run (``infeasible``: the midpoint closes in on the largest point that can). Only where
    no breakpoint is left, midpoints where one winner's advantage moved beyond the noise."""
    known = set(known)
    blocked = set(infeasible)
    urgent: dict[Key, None] = {}
    moved: dict[Key, None] = {}
    for dim in dims:
        lines: dict[Key, list[tuple[int, Key]]] = {}
        for shape in [*winners, *blocked]:
            rest = make_key({n: v for n, v in shape if n != dim.name})
            lines.setdefault(rest, []).append((sizes(shape)[dim.name], shape))
        for rest in sorted(lines, key=value_order):
            for (lo, a), (hi, b) in itertools.pairwise(sorted(lines[rest], key=lambda t: t[0])):
                mid = midpoint(lo, hi, dim.step)
                if mid is None or (shape := make_key({**dict(rest), dim.name: mid})) in known:
                    continue
                wa, wb = winners.get(a), winners.get(b)
                if (a in blocked) != (b in blocked) and (wa or wb) is not None:
                    urgent[shape] = None
                elif wa is not None and wb is not None and disagree(wa, wb):
                    (urgent if wa.config != wb.config else moved)[shape] = None
    return list(urgent) or list(moved)


def point_winner(point: Point, selectable: Callable[[Key, Key], bool], margin: float) -> Winner | None:
    """The winner ``tunectl.decide.select`` gives at ``point`` from its records, or None (nothing ran ok)."""
    winners = select_winners(
        point.records.values(),
        selectable=lambda _task, static, config: selectable(static, config),
        margin=margin,
    )
    return winners[0] if winners else None


def fastest(point: Point, k: int, selectable: Callable[[Key, Key], bool]) -> list[Key]:
    """The ``k`` selectable configs with the lowest median at ``point``, each config by the record
    selection counts (``tunectl.decide.select.fidelity``: a full measurement over a screening look,
    then the later one); ties in a fixed order."""
    timed = [r for r in point.records.values() if is_timing(r) and selectable(point.static, r.config)]
    best = latest(timed, lambda r: r.config, fidelity)
    return sorted(best, key=lambda c: (best[c].median_us, value_order(c)))[:k]


def neighbours(shape: Key, points: Sequence[Point], dims: Sequence[ShapeDim]) -> list[Point]:
    """The points nearest ``shape`` below and above along each of ``dims``, the other values equal."""
    at = {p.shape: p for p in points}
    return [at[s] for s in line_neighbours(shape, at, [d.name for d in dims])]


class Refined:
    """A run's work: ``search``'s items, then the refined points' as each level is planned.

    A static key is refined once the search has drawn all its planned points and they have finished."""

    def __init__(
        self, search: Search, plan: Plan, check_point: CheckPoint, *, margin: float | None = None
    ) -> None:
        self.search = search
        self.dims = [d for d in plan.spec.shapes if d.range is not None]
        self.margin = DEFAULT_MARGIN if margin is None else margin
        self.shortlist = plan.spec.search.refine_shortlist
        self._selectable = plan.facts.selectable
        self._check = check_point
        budget = plan.spec.search.refine_budget
        self.limit = {
            s: int(budget) if budget >= 1 else math.ceil(budget * n) for s, n, _ in plan.count.per_static
        }
        # Points the task cannot run: the starting grid's it skipped at plan time, then refined ones.
        self.refused: dict[Key, dict[Key, str]] = {s: {} for s, _, _ in plan.count.per_static}
        for static, shape, _ in plan.skipped_points:
            self.refused[static][shape] = "skipped when planned"
        self.extra: dict[Key, list[Key]] = {s: [] for s in self.limit}  # refined shapes, refused ones too
        self._settled: set[Key] = set()  # static keys refinement is done with

    def start(self, records: Iterable[Record] = ()) -> None:
        self.search.start(records)

    def draw(self, limit: int) -> list[WorkItem]:
        return self.search.draw(limit) + self._grow()

    def follow_up(self, records: Sequence[Record]) -> list[WorkItem]:
        return self.search.follow_up(records) + self._grow()

    def estimate(self) -> int:
        return self.search.estimate()

    def missing(self) -> int:
        """Items still without their records, a level whose points have all finished planned first
        (as ``draw`` would): zero only once no static key has anything left to measure or refine."""
        self._grow()
        return self.search.missing()

    def settled(self, static: Key) -> bool:
        """Whether refinement is done with ``static``: every level measured, no midpoint left."""
        return static in self._settled

    def _grow(self) -> list[WorkItem]:
        """Plan every level whose points have all finished; the new points' items not yet in."""
        items: list[WorkItem] = []
        grew = True
        while grew:
            grew = False
            # Only the static keys whose every point has finished: the search counts them as records come.
            for static in sorted(self.search.finished_keys - self._settled, key=value_order):
                level = self._level(static, self.search.points_at(static))
                if not level:
                    self._settled.add(static)
                for shape in level:
                    grew = True
                    items += self._add(static, shape)
        return items

    def _level(self, static: Key, points: list[Point]) -> list[Key]:
        """The next level's shapes at ``static``, within what is left of its budget."""
        left = self.limit[static] - len(self.extra[static])
        if left <= 0 or not self.dims:
            return []
        winners = {p.shape: point_winner(p, self._selectable, self.margin) for p in points}
        refused = self.refused[static]
        level = candidates(winners, [*winners, *refused], self.dims, infeasible=refused)[:left]
        self.extra[static] += level
        return level

    def _add(self, static: Key, shape: Key) -> list[WorkItem]:
        try:
            why = self._check(static, shape)
        except Exception as exc:  # a task's check that cannot take the value: the point is not run
            why = f"the task cannot check this point ({type(exc).__name__}: {exc})"
        if why is not None:
            self.refused[static][shape] = why
            return []
        point = self.search.add_point(static, shape, self._configs(static, shape))
        return self.search.issue(point)

    def _configs(self, static: Key, shape: Key) -> tuple[Key, ...]:
        """What a refined point measures: every config, or the default and its neighbours' fastest."""
        configs = self.search.configs_at(static)
        if self.shortlist <= 0:
            return configs
        near = neighbours(shape, self.search.points_at(static), self.dims)
        wanted = {c for p in near for c in fastest(p, self.shortlist, self._selectable)}
        return tuple(c for i, c in enumerate(configs) if i == 0 or c in wanted) if wanted else configs


def refined(search: Search, plan: Plan, check_point: CheckPoint) -> Search | Refined:
    """``search`` with refinement over it where the spec declares a range and a budget; else as is."""
    spec = plan.spec
    if not spec.ranges() or spec.search.refine_budget <= 0:
        return search
    return Refined(search, plan, check_point, margin=spec.select.margin)
