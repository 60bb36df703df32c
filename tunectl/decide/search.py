"""Which configs to measure at each point, decided as records come in.

A strategy (the spec's ``[search] strategy``) says how one point's configs are measured before its
finals; each is one class behind the small ``Strategy`` protocol:

- ``Grid`` (``grid``): every config, fully measured.
- ``Halving`` (``halving``): successive halving. Every config gets a cheap look (``min_budget`` of
  the spec's measurement time and samples); the best 1/``eta`` (and the default, the finals'
  baseline) go on to a look ``eta`` times longer, and so on while a look is shorter than a full
  measurement; the last rung's best go to the finals, which are the rigorous measurement. Cheap
  looks cannot rank configs a few percent apart, but they drop the ones far behind for a fraction of
  the cost. A config is ranked by its best look so far (``best_looks``): a slowdown that one look
  met, and the drift guard did not flag, does not cut it.

A model-based sampler is not among them: replayed on the recorded H200 grids, neither tunectl's own
Gaussian process nor Optuna's TPE or GP sampler found as many winners as halving for the same or more
measurement (``benchmarks/results/search_replay.md``).

The grid measures configs kept for reference only (ones a server at that static key cannot call as
they are, ``TuningTask.selectable``); a search skips them.

Whatever the strategy, a point ends with its *finals*: the default and up to ``finalists`` configs
whose p20 came in under the default's median (or within ``tie`` of it), and up to as many again
within ``tie`` of the fastest of them, are timed again in
``rounds`` interleaved rounds on one device, which gives each a paired speedup over the default
with a 95 % interval; selection rests on that (``tunectl.decide.select``).

A search is a function of the records it has seen: rebuilt from a run's records it asks for exactly
the items still missing, so a resumed run goes on where it stopped. It draws the plan's points only as
the dispatcher asks for more work, so however large the grid, a lane holds the points it started.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from tunectl.core.keys import Key, key_text
from tunectl.core.plan import Plan, Planned, WorkItem, comparison
from tunectl.core.record import Phase, Record
from tunectl.core.spec import SearchSpec
from tunectl.decide.dominated import Dominance
from tunectl.decide.points import Awaited, Looks, Measured, Point


class Strategy(Protocol):
    """How one point's configs are measured before its finals."""

    #: whether it measures configs kept for reference only (ones that may never win at the point)
    measures_reference: bool

    def measure(self, point: Point, looks: Looks) -> list[WorkItem] | Measured:
        """The items the point still needs, or, once they are all in, the records the finals choose
        from. A function of ``point.records``: asking twice gives the same answer."""
        ...

    def num_records(self, num_configs: int) -> int:
        """Records it writes at a point of ``num_configs`` configs, finals aside (for progress)."""
        ...


class Grid:
    """Every config, fully measured."""

    measures_reference = True

    def measure(self, point: Point, looks: Looks) -> list[WorkItem] | Measured:
        return looks.look(point, point.configs)

    def num_records(self, num_configs: int) -> int:
        return num_configs


class Halving:
    """Successive halving: rungs of cheap looks, the best 1/eta (and the default) going on."""

    measures_reference = False

    def __init__(self, settings: SearchSpec) -> None:
        self.settings = settings
        # Screening rungs: budgets min_budget * eta^r, all under a full measurement.
        self.num_rungs = max(1, math.floor(math.log(1.0 / settings.min_budget, settings.eta) + 1e-9))

    def measure(self, point: Point, looks: Looks) -> list[WorkItem] | Measured:
        """Screening rungs; their survivors go to the finals (or, with no finals, a full measurement)."""
        s = self.settings
        survivors: Sequence[Key] = point.configs
        rungs: list[Measured] = []
        for rung in range(self.num_rungs):
            looked = looks.look(point, survivors, rung=rung, budget=s.rung_budget(rung))
            if isinstance(looked, list):
                return looked
            rungs.append(looked)
            ranked = ranked_configs(best_looks(rungs))
            keep = max(1, math.ceil(len(survivors) / s.eta), min(s.finalists, len(ranked)))
            # The default goes on whatever its rank: the finals measure against it.
            survivors = [point.default, *(c for c in ranked[:keep] if c != point.default)]
        return best_looks(rungs) if s.finalists else looks.look(point, survivors, rung=self.num_rungs)

    def num_records(self, num_configs: int) -> int:
        eta = self.settings.eta
        screens = sum(max(1, math.ceil(num_configs / eta**r)) for r in range(self.num_rungs))
        return screens if self.settings.finalists else screens + math.ceil(num_configs / eta**self.num_rungs)


def strategy_of(settings: SearchSpec) -> Strategy:
    """The strategy a spec's ``[search]`` table names."""
    return Halving(settings) if settings.strategy == "halving" else Grid()


class Search:
    """The items of one lane of a run (one device type), chosen as its records arrive.

    Points are drawn from the plan only as the dispatcher asks for work (``draw``), so a lane holds
    the points it has started, never the whole grid. Records of points not drawn yet (a resumed
    run's) wait until their point is drawn or added.

    A record costs the work of its own point, however large the grid: a point works out what it needs
    again only when a record completes what it waited for (or one it did not wait for comes), and what
    ``missing``, ``estimate`` and ``settled`` answer is counted as points change, not walked for.
    """

    def __init__(self, plan: Plan, settings: SearchSpec | None = None, pool: str | None = None) -> None:
        self.settings = settings or plan.spec.search
        self.strategy = strategy_of(self.settings)
        self.looks = Looks(plan.spec.task, pool)
        halving = isinstance(self.strategy, Halving)
        self._dominance = Dominance(self.settings.skip_dominated if halving else 0.0, plan.facts.split_params)
        self._select = plan.facts.selectable  # written into the run when it was planned
        self._configs = {static: self._measured(static, configs) for static, configs in plan.configs}
        self._planned = [(self._configs[s], n) for s, n, _ in plan.count.per_static]
        self._points_at = {s: n for s, n, _ in plan.count.per_static}  # planned points per static key
        self._drawn: Counter[Key] = Counter()  # planned points drawn so far, per static key
        self._source: Iterator[Planned] | None = plan.points()
        self.points: dict[tuple[Key, Key], Point] = {}  # drawn or added, in that order
        self._by_text: dict[tuple[str, str], Point] = {}
        self._at: dict[Key, list[Point]] = {}  # static key -> its points
        self._drawing: Key | None = None  # the static key whose points are being drawn
        self.complete: set[Key] = set()  # static keys whose planned points are all drawn
        self.finished_keys: set[Key] = set()  # complete static keys whose every point is finished
        self._waiting: dict[tuple[str, str], dict[str, Record]] = {}  # records of points not yet here
        self._added = 0  # records expected of the points added after planning
        self._num_records = 0  # records the points hold
        self._open_items = 0  # items the points need without all their records
        self._open_at: Counter[Key] = Counter()  # static key -> its points not finished

    def start(self, records: Iterable[Record] = ()) -> None:
        """Take in the ``records`` a stopped run already has; their points ask only for what is missing."""
        for record in records:
            if self._take(record) is None:
                self._waiting.setdefault((record.static_key, record.shape_key), {})[record.item_id] = record

    def draw(self, limit: int) -> list[WorkItem]:
        """Items of points not started yet, point by point, until ``limit`` are issued (a point's first
        items go out together, so it may be more); none once every planned point is drawn."""
        items: list[WorkItem] = []
        while len(items) < limit:
            point = self._draw_point()
            if point is None:
                break
            items += self._issue(point)
        return items

    def follow_up(self, records: Sequence[Record]) -> list[WorkItem]:
        """Items the records' points need next (none while a point's other items are still out)."""
        touched = {id(p): p for p in map(self._take, records) if p is not None}
        return [item for point in touched.values() for item in self._issue(point)]

    def estimate(self) -> int:
        """Records the run is expected to write in all (for progress), given what is known now."""
        planned = sum(n * self._per_point(len(configs)) for configs, n in self._planned)
        return max(planned + self._added, self._num_records)

    def missing(self) -> int:
        """Items still without their records: every drawn point's, finals included, and each point the
        plan has not given out yet counted at one item per config (its finals cannot be known yet).

        Zero once the search is done; a run is finished only then."""
        undrawn = 0
        if self._source is not None:
            left = {static: max(0, n - self._drawn[static]) for static, n in self._points_at.items()}
            undrawn = sum(n * len(self._configs[static]) for static, n in left.items())
        return undrawn + self._open_items

    def add_point(self, static: Key, shape: Key, configs: tuple[Key, ...]) -> Point:
        """A point planned after the run began (refinement), its ``configs`` the default first."""
        if (static, shape) not in self.points:
            self._added += self._per_point(len(configs))
        return self._place(static, shape, configs)

    def configs_at(self, static: Key) -> tuple[Key, ...]:
        """The configs a point at ``static`` measures, the default first."""
        return self._configs[static]

    def points_at(self, static: Key) -> list[Point]:
        """The points of ``static`` drawn or added so far, in that order."""
        return self._at.get(static, [])

    def _draw_point(self) -> Point | None:
        """The plan's next point, now the search's; None once the plan has no more."""
        planned = next(self._source, None) if self._source is not None else None
        static = None if planned is None else planned[0]
        if static != self._drawing and self._drawing is not None:
            self.complete.add(self._drawing)  # points come static key by static key
            self._count_open(self._drawing, 0)
        self._drawing = static
        if planned is None:
            self._source = None
            return None
        self._drawn[planned[0]] += 1
        return self._place(planned[0], planned[1], self._configs[planned[0]])

    def _place(self, static: Key, shape: Key, configs: tuple[Key, ...]) -> Point:
        point = self.points.get((static, shape))
        if point is None:
            texts = (key_text(static), key_text(shape))
            point = self.points[(static, shape)] = Point(static, shape, configs, key_texts=texts)
            self._by_text[texts] = point
            self._at.setdefault(static, []).append(point)
            point.records.update(self._waiting.pop(texts, {}))
            self._dominance.add(point)  # with the records a resumed run has of it
            self._num_records += len(point.records)
            self._count_open(static, 1)  # not finished until its needs are worked out
            self._refresh(point)
        return point

    def _measured(self, static: Key, configs: tuple[Key, ...]) -> tuple[Key, ...]:
        """The configs the strategy measures at ``static``: all of them, or the selectable ones."""
        if self.strategy.measures_reference:
            return configs
        return tuple(c for c in configs if c == configs[0] or self._select(static, c))

    def _per_point(self, num_configs: int) -> int:
        finalists = self.settings.finalists
        finals = 1 + min(finalists, num_configs - 1) if finalists else 0
        return self.strategy.num_records(num_configs) + finals

    def settled(self, static: Key) -> bool:
        """Whether every planned point of ``static`` is drawn and finished (its finals too)."""
        return static in self.finished_keys

    def finished(self, point: Point) -> bool:
        """Whether every item the point needs (its finals too) has its records."""
        return point.finished

    def take(self, record: Record) -> Point | None:
        """Take in one record; its point, if the search has it."""
        return self._take(record)

    def issue(self, point: Point) -> list[WorkItem]:
        """The point's items not yet handed out."""
        return self._issue(point)

    def _take(self, record: Record) -> Point | None:
        point = self._by_text.get((record.static_key, record.shape_key))
        if point is None:
            return None
        self._num_records += record.item_id not in point.records
        point.records[record.item_id] = record
        self._dominance.took(point, record)
        awaited = point.awaited
        before = awaited.open
        came = awaited.arrived(record.item_id)
        self._open_items += awaited.open - before
        # A record one of several open items waited for leaves the rest of what the point needs as it
        # was: the look those items belong to is still short, and the looks before it are whole.
        if not came or not awaited.open:
            self._refresh(point)
        return point

    def _refresh(self, point: Point) -> None:
        """Work out again what ``point`` needs and, of that, what is still without its records."""
        point.needs, point.fresh = self._needs(point), True
        awaited = Awaited()
        for item in point.needs:
            awaited.add(item, point.records)
        self._open_items += awaited.open - point.awaited.open
        point.awaited = awaited
        if point.finished != (not awaited.open):
            point.finished = not awaited.open
            self._count_open(point.static, -1 if point.finished else 1)
        if point.finished:  # a lane holds every point it started: its items go, its records stay
            point.names.clear()

    def _count_open(self, static: Key, change: int) -> None:
        """``change`` the count of ``static``'s points not finished; whether the key is finished follows."""
        self._open_at[static] += change
        if static in self.complete and not self._open_at[static]:
            self.finished_keys.add(static)
        else:
            self.finished_keys.discard(static)

    def _issue(self, point: Point) -> list[WorkItem]:
        """The point's needed items not handed out nor done: none unless its needs changed since it
        last handed items out (everything it needed then went out, or was done)."""
        if not point.fresh:
            return []
        point.fresh = False
        items = [i for i in point.needs if i.item_id not in point.issued and point.awaited.is_open(i.item_id)]
        point.issued.update(i.item_id for i in items)
        return self._dominance.marked(point, items)

    def _needs(self, point: Point) -> list[WorkItem]:
        measured = self.strategy.measure(point, self.looks)
        if isinstance(measured, list):  # items still to measure before the finals
            return measured
        final = self._finals(point, measured)
        return [final] if final is not None else []

    def _finals(self, point: Point, measured: Measured) -> WorkItem | None:
        selectable = functools.partial(self._select, point.static)
        arms = finals_arms(measured, point.default, self.settings, selectable)
        if not arms:
            return None
        item = comparison(self.looks.task, point.static, point.shape, arms, Phase.FINAL, self.settings.rounds)
        return dataclasses.replace(item, item_id=self.looks.pooled(item.item_id))


def finals_arms(
    measured: Measured, default: Key, settings: SearchSpec, selectable: Callable[[Key], bool]
) -> tuple[Key, ...]:
    """The arms of a point's finals: the default, then up to ``settings.finalists`` configs whose p20
    came in under the default's median (or within ``tie`` of it), and up to as many again within
    ``tie`` of the fastest of them; () where none came near or the default has no time."""
    base = measured.get(default)
    if not settings.finalists or base is None or base.status != "ok" or base.median_us is None:
        return ()
    # By each config's p20, not its median: a noisy config (a bimodal kernel, a disturbed
    # measurement) whose fast mode beats the default still gets its interleaved hearing.
    bar = base.median_us * (1.0 + settings.tie)
    near = [
        c
        for c in ranked_configs(measured, optimistic_us)
        if c != default and optimistic_us(measured[c]) < bar and selectable(c)
    ]
    if not near:
        return ()
    # Configs within ``tie`` of the fastest go too, up to as many again: short looks cannot order
    # configs 2 % apart, and the one left out is often what another run of the spec chooses.
    fastest = optimistic_us(measured[near[0]]) * (1.0 + settings.tie)
    k = settings.finalists
    return (default, *near[:k], *(c for c in near[k : 2 * k] if optimistic_us(measured[c]) <= fastest))


def best_looks(rungs: Sequence[Measured]) -> Measured:
    """Per config of the last of ``rungs`` (a point's screening looks, oldest first), its fastest look
    so far: the record with the lowest ``optimistic_us`` among its looks timed by the method of its
    last. A passing slowdown (a neighbour's burst, a clock or memory state the drift guard's reference
    barely moves for) makes a look slower, never faster; a config read slow in one look keeps its
    better reading instead of being cut on the bad one. A failed last look stands as it is."""
    if len(rungs) == 1:
        return rungs[0]
    best: Measured = {}
    for config, last in rungs[-1].items():
        looks = [m[config] for m in rungs if config in m]
        same = [r for r in looks if r.status == "ok" and r.timing is last.timing]
        best[config] = min(same, key=optimistic_us) if last.status == "ok" else last
    return best


def median_us(record: Record) -> float:
    return record.median_us if record.median_us is not None else math.inf


def optimistic_us(record: Record) -> float:
    """The record's p20 where it has one: what the config does in its fast mode."""
    return record.p20_us if record.p20_us else median_us(record)


def ranked_configs(
    measured: Mapping[Key, Record], time_us: Callable[[Record], float] = median_us
) -> list[Key]:
    """Configs measured ok, fastest first by ``time_us`` (ties in canonical order). Only rows timed by
    the method of the newest one are ranked: a run resumed under another timing method does not set
    one method's times against the other's."""
    ok_rows = {c: r for c, r in measured.items() if r.status == "ok"}
    newest = max(ok_rows.values(), key=lambda r: r.finished_at).timing if ok_rows else None
    ok = sorted(((time_us(r), c) for c, r in ok_rows.items() if r.timing is newest), key=lambda t: t[0])
    ranked: list[Key] = []
    for _, tied in itertools.groupby(ok, key=lambda t: t[0]):  # only ties need the configs' texts
        group = [c for _, c in tied]
        ranked += sorted(group, key=key_text) if len(group) > 1 else group
    return ranked
