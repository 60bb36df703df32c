"""What a lane has to hand out: its queue of issued items, topped up from its work as workers take them.

A lane's work (``tunectl.decide.search.Search``) is asked for new points only when the lane's queue
runs below its look-ahead: enough issued items for every worker's calls and its announced next item,
and for the compile processes to build kernels ahead of the workers. However large the grid, the
driver holds the items in flight and the look-ahead, never the plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tunectl.core.plan import WorkItem
from tunectl.core.record import Record
from tunectl.orchestrator.blame import Verdict
from tunectl.orchestrator.compile_schedule import BuildScheduler
from tunectl.orchestrator.workqueue import WorkQueue

#: Issued items a lane keeps waiting per worker: its calls in flight (``prefetch``), the item announced
#: as its lookahead, and the rest for the compile processes to build kernels for ahead of it.
LOOKAHEAD_PER_WORKER = 16


def lookahead(num_workers: int) -> int:
    """The issued items a lane of ``num_workers`` workers keeps waiting in its queue."""
    return LOOKAHEAD_PER_WORKER * max(1, num_workers)


class LaneWork(Protocol):
    """Where a lane's items come from: new points on demand, and what finished items call for next.

    Once ``draw`` gives nothing, the work's later items come only as ``follow_up``s."""

    def draw(self, limit: int) -> list[WorkItem]: ...

    def follow_up(self, records: Sequence[Record]) -> list[WorkItem]: ...


@dataclass(frozen=True)
class Lane:
    """Workers of one pool, the work only they may run, and its first items (already drawn)."""

    name: str
    workers: tuple[Any, ...]
    work: LaneWork
    items: tuple[WorkItem, ...] = ()


class LaneFeed:
    """A lane's queue, drawing from its work whenever fewer than ``ahead`` items wait."""

    def __init__(self, lane: Lane, builds: BuildScheduler | None = None) -> None:
        self.name, self.work, self.builds = lane.name, lane.work, builds
        self.ahead = lookahead(len(lane.workers))
        self.queue = WorkQueue(lane.items)
        self.drawn_all = False
        if builds is not None:
            builds.book.add(lane.items)

    def __len__(self) -> int:
        return len(self.queue)

    def top_up(self) -> None:
        """Draw new points' items until the look-ahead is full (nothing once the work has no more)."""
        if self.drawn_all or len(self.queue) >= self.ahead:
            return
        new = self.work.draw(self.ahead - len(self.queue))
        self.drawn_all = not new
        self._push(new)

    def answered(self, records: Sequence[Record]) -> None:
        """Queue what a finished item's records call for next."""
        self._push(self.work.follow_up(records))

    def requeue(self, verdict: Verdict) -> None:
        """A dead worker's items: the innocent back to the head of their points, the suspects alone."""
        if self.builds is not None:
            for item in [*verdict.innocent, *verdict.retry]:
                self.builds.book.returned(item)
        for item in reversed(verdict.innocent):
            self.queue.push_front(item)
        for item in verdict.retry:
            self.queue.push_retry(item)

    def _push(self, items: Iterable[WorkItem]) -> None:
        new = list(items)
        for item in new:
            self.queue.push(item)
        if self.builds is not None and new:
            self.builds.book.add(new)
            self.builds.pump()
