"""A tuning run that probes itself (``[search] probes = n``; what a probe is: ``tunectl.decide.probes``).

``Probed`` is a layer over the search and refinement that plans a static key's probes once both are
done with it, from finished records only, so a resumed run plans the same probes and asks only for
the arms without a row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from tunectl.core.keys import Key
from tunectl.core.plan import Plan, WorkItem, in_pool, selectable_in
from tunectl.core.record import Phase, Record
from tunectl.decide.points import Awaited
from tunectl.decide.probes import CheckPoint, probes_of
from tunectl.decide.refine import Refined
from tunectl.decide.search import Search


class Probed:
    """A run's work with ``[search] probes`` on: ``inner``'s items (the search, refined or not), then each
    static key's probes, planned once ``inner`` is done with it (every point finished, refinement
    settled), from finished records only: a resumed run plans the same ones and asks only for the arms
    without a row. A static key's probes go out when planned; their rows are counted off as they come."""

    def __init__(
        self, inner: Search | Refined, search: Search, plan: Plan, check_point: CheckPoint, pool: str | None
    ) -> None:
        self.inner, self.search, self.plan = inner, search, plan
        self._check = check_point
        self._pool = pool
        self._unplanned = [s for s, _, _ in plan.count.per_static]  # static keys without probes yet
        self._done: set[str] = set()  # record ids of probe rows
        self._awaited = Awaited()  # the planned probes without all their rows
        self._planned_records = 0  # rows the planned probes write

    def start(self, records: Iterable[Record] = ()) -> None:
        records = list(records)
        self._done.update(r.item_id for r in records if r.phase is Phase.PROBE)
        self.inner.start([r for r in records if r.phase is not Phase.PROBE])

    def draw(self, limit: int) -> list[WorkItem]:
        return self.inner.draw(limit) + self._grow()

    def follow_up(self, records: Sequence[Record]) -> list[WorkItem]:
        for record in records:
            if record.phase is Phase.PROBE:
                self._done.add(record.item_id)
                self._awaited.arrived(record.item_id)
        return self.inner.follow_up([r for r in records if r.phase is not Phase.PROBE]) + self._grow()

    def estimate(self) -> int:
        return self.inner.estimate() + self._planned_records

    def missing(self) -> int:
        """The inner work's missing items, then the planned probes without all their rows."""
        left = self.inner.missing()
        self._grow()
        return left + self._awaited.open

    def _grow(self) -> list[WorkItem]:
        """The probes of every static key ``inner`` is now done with, those not done, each once."""
        out = []
        for static in [s for s in self._unplanned if self.inner.settled(s)]:
            self._unplanned.remove(static)
            for item in self._probes(static):
                self._planned_records += len(item.record_ids())
                if self._awaited.add(item, self._done):
                    out.append(item)
        return out

    def _probes(self, static: Key) -> list[WorkItem]:
        search = self.plan.spec.search
        made = probes_of(
            self.plan.spec,
            [r for p in self.search.points_at(static) for r in p.records.values()],
            selectable_in([self.plan.facts]),
            lambda _: self.search.configs_at(static)[0],
            self._check,
            per_cell=search.probes,
            shortlist=search.probe_shortlist,
            rounds=search.rounds,
            facts=self.plan.facts,
        )
        if self._pool is None:
            return list(made.items)
        return [dataclasses.replace(i, item_id=in_pool(i.item_id, self._pool)) for i in made.items]


def probed(
    work: Search | Refined, search: Search, plan: Plan, check_point: CheckPoint, pool: str | None
) -> Search | Refined | Probed:
    """``work`` with its cells probed where the spec asks for probes (``[search] probes``); else as is."""
    if plan.spec.search.probes <= 0 or not plan.spec.ranges():
        return work
    return Probed(work, search, plan, check_point, pool)
