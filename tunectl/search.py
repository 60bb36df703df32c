"""Which configs to measure at each point, decided as results come in.

Three strategies, chosen in the spec's ``[search]`` table:

- ``grid``: every config, fully measured.
- ``halving``: successive halving. Every config gets a cheap look (``min_budget`` of the spec's
  measurement time and samples); the best 1/``eta`` (and the default, the finals' baseline) go on to
  a look ``eta`` times longer, and so on while a look is shorter than a full measurement; the last
  rung's best go to the finals, which are the rigorous measurement. Cheap looks cannot rank configs
  a few percent apart, but they drop the ones far behind for a fraction of the cost.
- ``model``: a model-based sampler with a measurement budget per point. It measures the default,
  then the winners so far at the nearest shapes already measured (warm start), then, one at a time,
  the config with the largest expected improvement under a Gaussian-process model of log(time over
  the default's time) across configs and shapes (``tunectl.surrogate``); it stops at the budget or
  when no config is expected to gain ``min_gain``.

The grid measures configs kept for reference only (ones a server at that static key cannot call as
they are, ``TuningTask.selectable``); a search skips them.

Whatever the strategy, a point ends with its *finals*: the default and up to ``finalists`` configs
whose p20 came in under the default's median (or within ``tie`` of it) are timed again in
``rounds`` interleaved rounds on one device, which gives each a paired speedup over the default
with a 95 % interval; selection rests on that (``tunectl.select``).

A search is a function of the records it has seen: rebuilt from a run's rows it asks for exactly
the items still missing, so a resumed run goes on where it stopped.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tunectl.keys import Key, key_text, make_key
from tunectl.plan import Plan, WorkItem, comparison, in_pool, item_id
from tunectl.record import Record
from tunectl.spec import SearchSpec

Row = Mapping[str, Any]


@dataclass
class _Point:
    static: Key
    shape: Key
    configs: tuple[Key, ...]  # the default first
    rows: dict[str, Row] = field(default_factory=dict)  # item id -> latest row
    issued: set[str] = field(default_factory=set)
    waiting: bool = False  # model: held back until a neighbouring shape is settled
    settled: bool = False  # model: no more configs to measure here

    def done(self, iid: str) -> bool:
        return iid in self.rows

    def measured(self, ids: Mapping[Key, str]) -> dict[Key, Row]:
        return {c: self.rows[i] for c, i in ids.items() if i in self.rows}


class Search:
    """The items of one lane of a run (one device type), chosen as its records arrive."""

    def __init__(self, plan: Plan, settings: SearchSpec | None = None, pool: str | None = None) -> None:
        self.plan, self.settings, self.pool = plan, settings or plan.spec.search, pool
        self.task = plan.spec.task
        points: dict[tuple[Key, Key], list[WorkItem]] = {}
        for item in plan.items:
            points.setdefault(item.point, []).append(item)
        self._select = _task_rule(self.task)
        self.points: dict[tuple[Key, Key], _Point] = {}
        for (static, shape), items in points.items():
            default = next(i.config for i in items if i.is_default)
            configs = [default, *(i.config for i in items if not i.is_default)]
            if self.settings.strategy != "grid":  # a search skips configs that may never win here
                configs = [c for c in configs if c == default or self._select(static, c)]
            self.points[(static, shape)] = _Point(static, shape, tuple(configs))
        self._by_text = {(key_text(s), key_text(h)): p for (s, h), p in self.points.items()}
        # The model's two waves: every other shape of each static key (in order) starts at once; the
        # rest wait for a neighbour, so they start from its winners. One GPU loses nothing by this.
        self._wave: dict[int, int] = {}
        for static in {p.static for p in self.points.values()}:
            shapes = sorted(
                (p for p in self.points.values() if p.static == static), key=lambda p: _values(p.shape)
            )
            self._wave.update({id(p): i % 2 for i, p in enumerate(shapes)})

    # -- the driver's side ------------------------------------------------------------------------

    def start(self, rows: Iterable[Row] = ()) -> list[WorkItem]:
        """Items to run first, after taking in ``rows`` a stopped run already has."""
        for row in rows:
            self._take(row)
        return [item for point in self.points.values() for item in self._issue(point)]

    def follow_up(self, records: Sequence[Record | Row]) -> list[WorkItem]:
        """Items the records' point needs next (none while its other items are still out)."""
        touched: dict[int, _Point] = {}
        for record in records:
            point = self._take(asdict(record) if isinstance(record, Record) else record)
            if point is not None:
                touched[id(point)] = point
        items = [item for point in touched.values() for item in self._issue(point)]
        return items + [item for p in self.points.values() if p.waiting for item in self._issue(p)]

    def estimate(self) -> int:
        """Records the run is expected to write in all (for progress), given what is known now."""
        s, total = self.settings, 0
        for point in self.points.values():
            n = len(point.configs)
            if s.strategy == "grid":
                total += n
            elif s.strategy == "halving":
                total += sum(max(1, math.ceil(n / s.eta**r)) for r in range(self._num_rungs()))
            else:
                total += self._model_budget(n)
            total += 1 + min(s.finalists, n - 1) if s.finalists else 0
        return max(total, sum(len(p.rows) for p in self.points.values()))

    def _take(self, row: Row) -> _Point | None:
        point = self._by_text.get((row["static_key"], row["shape_key"]))
        if point is not None:
            point.rows[row["item_id"]] = row
        return point

    def _issue(self, point: _Point) -> list[WorkItem]:
        items = [i for i in self._needs(point) if i.item_id not in point.issued and not self._done(point, i)]
        point.issued.update(i.item_id for i in items)
        return items

    def _done(self, point: _Point, item: WorkItem) -> bool:
        return all(point.done(rid) for rid in item.record_ids())

    # -- what a point needs now -------------------------------------------------------------------

    def _needs(self, point: _Point) -> list[WorkItem]:
        strategy = self.settings.strategy
        if strategy == "halving":
            measured = self._halving(point)
        elif strategy == "model":
            measured = self._model(point)
        else:
            measured = self._look(point, point.configs, rung=None)
        if isinstance(measured, list):  # items still to measure before the finals
            return measured
        final = self._finals(point, measured)
        return [final] if final is not None else []

    def _item(self, point: _Point, config: Key, rung: int | None, budget: float = 1.0) -> WorkItem:
        extra = (make_key({"rung": rung, "budget": budget}),) if budget < 1.0 else ()
        iid = item_id(self.task, point.static, point.shape, config, *extra)
        if self.pool is not None:
            iid = in_pool(iid, self.pool)
        phase = "screen" if budget < 1.0 else "measure"
        return WorkItem(iid, self.task, point.static, point.shape, config, config == point.configs[0], phase,
                        rung, budget)  # fmt: skip

    def _look(
        self, point: _Point, configs: Sequence[Key], rung: int | None, budget: float = 1.0
    ) -> list[WorkItem] | dict[Key, Row]:
        """The rows of ``configs`` at this fidelity once all are in; else the items still missing."""
        ids = {c: self._item(point, c, rung, budget) for c in configs}
        missing = [item for item in ids.values() if not point.done(item.item_id)]
        return missing or point.measured({c: i.item_id for c, i in ids.items()})

    def _num_rungs(self) -> int:
        """Screening rungs: budgets min_budget * eta^r, all under a full measurement."""
        s = self.settings
        return max(1, math.floor(math.log(1.0 / s.min_budget, s.eta) + 1e-9))

    def _halving(self, point: _Point) -> list[WorkItem] | dict[Key, Row]:
        """Screening rungs; their survivors go to the finals (or, with no finals, a full measurement)."""
        s = self.settings
        survivors: Sequence[Key] = point.configs
        for rung in range(self._num_rungs()):
            looked = self._look(point, survivors, rung, s.rung_budget(rung))
            if isinstance(looked, list):
                return looked
            ranked = _ranked(looked)
            keep = max(1, math.ceil(len(survivors) / s.eta), min(s.finalists, len(ranked)))
            # The default goes on whatever its rank: the finals measure against it.
            survivors = [point.configs[0], *(c for c in ranked[:keep] if c != point.configs[0])]
        return looked if s.finalists else self._look(point, survivors, self._num_rungs())

    def _model_budget(self, n: int) -> int:
        b = self.settings.budget
        return min(n, max(1, math.ceil(b * n) if b <= 1.0 else int(b)))

    def _full(self, point: _Point) -> dict[Key, Row]:
        """The point's full measurements so far, by config."""
        return point.measured({c: self._item(point, c, None).item_id for c in point.configs})

    def _model(self, point: _Point) -> list[WorkItem] | dict[Key, Row]:
        ids = {c: self._item(point, c, None).item_id for c in point.configs}
        measured = point.measured(ids)
        outstanding = [c for c, i in ids.items() if i in point.issued and i not in point.rows]
        if outstanding:
            return [self._item(point, c, None) for c in outstanding]
        if not measured and self._wave[id(point)] and not any(n.settled for n in self._neighbours(point)):
            point.waiting = True  # starts once a neighbouring shape has its answer, to start from it
            return []
        point.waiting = False
        nxt = None
        if len(measured) < self._model_budget(len(point.configs)):
            nxt = self._propose(point, measured)
        if nxt is None:
            point.settled = True
            return measured
        return [self._item(point, nxt, None)]

    def _propose(self, point: _Point, measured: Mapping[Key, Row]) -> Key | None:
        default = point.configs[0]
        if default not in measured:
            return default
        untried = [c for c in point.configs if c not in measured]
        settled = [n for n in self._neighbours(point) if n.settled][: self.settings.warm_start]
        for neighbour in settled:
            for config in _ranked(self._full(neighbour))[:2]:  # its best two
                if config in untried:
                    return config
        from tunectl.surrogate import propose

        data = [(c, p.static, p.shape, row) for p in self.points.values() for c, row in self._full(p).items()]
        s = self.settings
        return propose(untried, point.static, point.shape, data, s.min_gain, s.explore)

    def _neighbours(self, point: _Point) -> list[_Point]:
        """Other points of the same static key, nearest shape first."""
        here = dict(point.shape)
        others = [p for p in self.points.values() if p.static == point.static and p is not point]
        return sorted(others, key=lambda p: (_shape_distance(here, dict(p.shape)), key_text(p.shape)))

    def _finals(self, point: _Point, measured: Mapping[Key, Row]) -> WorkItem | None:
        s, default = self.settings, point.configs[0]
        base = measured.get(default)
        if not s.finalists or base is None or base["status"] != "ok":
            return None
        # By each config's p20, not its median: a noisy config (a bimodal kernel, a disturbed
        # measurement) whose fast mode beats the default still gets its interleaved hearing.
        bar = base["median_us"] * (1.0 + s.tie)
        finalists = [
            c
            for c in _ranked(measured, _optimistic)
            if c != default and _optimistic(measured[c]) < bar and self._select(point.static, c)
        ][: s.finalists]
        if not finalists:
            return None
        item = comparison(self.task, point.static, point.shape, (default, *finalists), "final", s.rounds)
        return (
            item if self.pool is None else dataclasses.replace(item, item_id=in_pool(item.item_id, self.pool))
        )


def _median(row: Row) -> float:
    return float(row["median_us"])


def _optimistic(row: Row) -> float:
    return float(row.get("p20_us") or row["median_us"])


def _ranked(rows: Mapping[Key, Row], time: Callable[[Row], float] = _median) -> list[Key]:
    """Configs measured ok, fastest first by ``time`` (ties in canonical order)."""
    ok = [(time(r), key_text(c), c) for c, r in rows.items() if r["status"] == "ok"]
    return [c for _, _, c in sorted(ok, key=lambda t: (t[0], t[1]))]


def _values(key: Key) -> tuple[Any, ...]:
    return tuple((type(v).__name__, v) for _, v in key)


def _shape_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    return sum(
        (math.log2(a[k]) - math.log2(b[k])) ** 2
        for k in a
        if isinstance(a[k], (int, float)) and isinstance(b.get(k), (int, float)) and a[k] > 0 and b[k] > 0
    )


def _task_rule(task: str) -> Any:
    from tunectl.select import task_selectable

    return lambda static, config: task_selectable(task, static, config)
