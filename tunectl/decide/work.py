"""A tuning run's work, and where the rows a run holds fall short of it.

A run's work is a function of the rows it has seen (``tunectl.decide.search``): rebuilt from them it
asks for exactly the items still missing, which is how a resume goes on. The same rebuild tells,
after a part of the run's results was damaged, which points lost rows: a damaged part cannot say
what it held, but the points whose items the rebuilt work asks for again are the ones whose
decisions would now rest on less than the run measured. A run whose work is known up front
(validation, holdout, probes) runs ``FixedItems``.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tunectl.core.errors import UserError
from tunectl.core.keys import Key, key_text
from tunectl.core.plan import Plan, WorkItem, in_pool, plan
from tunectl.core.record import Record
from tunectl.core.registry import get_task
from tunectl.core.spec import parse_spec
from tunectl.decide.inline_probes import Probed, probed
from tunectl.decide.probes import CheckPoint
from tunectl.decide.refine import Refined, refined
from tunectl.decide.search import Search
from tunectl.decide.select import LostRows, Winner
from tunectl.store.results import Dataset
from tunectl.store.runs import RunInfo, load_run, run_exists


def tuning_work(work: Plan, check_point: CheckPoint, pool: str | None) -> Search | Refined | Probed:
    """One pool's work in a tuning run of ``work``: the spec's search, refined and probed where the
    spec asks (``pool``: the pool's name when the run has several, else None)."""
    found = Search(work, work.spec.search, pool)
    return probed(refined(found, work, check_point), found, work, check_point, pool)


@dataclass(frozen=True)
class Shortfall:
    """The points of run ``run_id`` (of ``task``) whose items lack rows, as (static key text, shape key
    text); ``points`` None where the run's work cannot be rebuilt (no spec, a task not installed
    here): then any of its points may lack rows."""

    run_id: str
    task: str
    points: frozenset[tuple[str, str]] | None

    def touches(self, task: str, static: Key, shape: Key) -> bool:
        """Whether the point lacks rows of this run, or may."""
        if task != self.task:
            return False
        return self.points is None or (key_text(static), key_text(shape)) in self.points

    @property
    def lost(self) -> LostRows:
        """What a point it touches lost."""
        return LostRows(self.run_id, certain=self.points is not None)


def shortfall(info: RunInfo, records: Iterable[Record]) -> Shortfall:
    """Where run ``info``'s work, rebuilt from ``records`` (the rows of the run that can be read), still
    asks for items, as a resume would: the points that lost rows, or never had them."""
    if info.kind != "tune" or not info.spec_text:
        return Shortfall(info.run_id, info.task, None)
    try:
        spec = parse_spec(info.spec_text, info.spec_path, info.name, stored=True)
        task = get_task(spec.task)
        work = plan(spec, task)
    except (UserError, KeyError, ImportError):
        return Shortfall(info.run_id, info.task, None)

    def check(static: Key, shape: Key) -> str | None:
        return task.check_point(dict(static), dict(shape))  # type: ignore[no-any-return]

    rows = [r for r in records if r.run_id == info.run_id]
    points: set[tuple[str, str]] = set()
    for pool in info.pools if len(info.pools) > 1 else (None,):
        lane = tuning_work(work, check, pool)
        lane.start(rows)
        points |= {(key_text(i.static), key_text(i.shape)) for i in lane.draw(sys.maxsize)}
    return Shortfall(info.run_id, info.task, frozenset(points))


def shortfalls(results: str | Path, dataset: Dataset) -> list[Shortfall]:
    """Each run of ``dataset`` that lost rows to unreadable parts, with the points that lack them
    (``dataset``: a read holding every row of those runs that can be read)."""
    out = []
    for run_id in dataset.damaged_runs:
        if run_exists(results, run_id):
            out.append(shortfall(load_run(results, run_id), dataset.records))
        else:  # parts without run metadata: which points they held cannot be told
            task = next(p.task for p in dataset.damaged if p.run_id == run_id)
            out.append(Shortfall(run_id, task, None))
    return out


def with_shortfalls(winners: Iterable[Winner], gaps: Sequence[Shortfall]) -> list[Winner]:
    """``winners``, each whose point (or the tuned point serving it) lacks rows of a run in ``gaps``
    saying so in its reason."""
    out = []
    for w in winners:
        shapes = [w.shape] if w.served_by is None else [w.shape, w.served_by]
        lost = tuple(g.lost for g in gaps if any(g.touches(w.task, w.static, s) for s in shapes))
        out.append(dataclasses.replace(w, lost=w.lost + lost) if lost else w)
    return out


class FixedItems:
    """A run's work when it is known up front (validation): what a search is, without the choosing."""

    def __init__(self, items: Sequence[WorkItem], pool: str | None = None) -> None:
        self.items = [
            item if pool is None else dataclasses.replace(item, item_id=in_pool(item.item_id, pool))
            for item in items
        ]
        self._done: set[str] = set()
        self._next = 0  # the first item not yet drawn

    def start(self, records: Iterable[Record] = ()) -> None:
        self._done.update(r.item_id for r in records)

    def draw(self, limit: int) -> list[WorkItem]:
        """Up to ``limit`` more items without their records, in order."""
        out: list[WorkItem] = []
        while len(out) < limit and self._next < len(self.items):
            item = self.items[self._next]
            self._next += 1
            if not set(item.record_ids()) <= self._done:
                out.append(item)
        return out

    def follow_up(self, records: Sequence[Record]) -> list[WorkItem]:
        self._done.update(r.item_id for r in records)
        return []

    def estimate(self) -> int:
        return sum(len(i.record_ids()) for i in self.items)

    def missing(self) -> int:
        """Items without all their records."""
        return sum(not set(item.record_ids()) <= self._done for item in self.items)
