"""A lane's work queue, and the records the orchestrator writes for items no worker could report on."""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Container, Iterable, Sequence
from typing import Any

from tunectl.core.keys import key_text
from tunectl.core.plan import WorkItem
from tunectl.core.record import Record, Status
from tunectl.measure.records import CallContext, failed, members_of

_SCAN_POINTS = 64  # points looked at for one with a built kernel (builds go in queue order)
_SCAN_ITEMS = 32  # items of a point looked at for one whose kernel is built


class WorkQueue:
    """Items grouped by (static, shape) point, handed out with affinity to a worker's current point.

    Suspects (items that may have killed a worker) wait in a queue of their own and go out first,
    one per call, never announced as anyone's lookahead.
    """

    def __init__(self, items: Iterable[WorkItem]) -> None:
        self.groups: OrderedDict[Any, deque[WorkItem]] = OrderedDict()
        self.retry: deque[WorkItem] = deque()
        self.size = 0
        for item in items:
            self.groups.setdefault(item.point, deque()).append(item)
            self.size += 1

    def __len__(self) -> int:
        return self.size

    def push_front(self, item: WorkItem) -> None:
        """Back to the head of its point's group: the next worker on that point takes it first."""
        self.groups.setdefault(item.point, deque()).appendleft(item)
        self.groups.move_to_end(item.point, last=False)
        self.size += 1

    def push(self, item: WorkItem) -> None:
        """A new item, behind those already waiting at its point."""
        self.groups.setdefault(item.point, deque()).append(item)
        self.size += 1

    def push_retry(self, item: WorkItem) -> None:
        self.retry.append(item)
        self.size += 1

    def pop(
        self,
        point: Any,
        busy: Container[Any],
        rank: Callable[[WorkItem], int] | None = None,
        recent: Sequence[Any] = (),
    ) -> WorkItem | None:
        """A retry first; else an item at ``point``; else one at a point the asking worker was at lately
        (``recent``, newest last: it keeps what it built there); else one at a point no other worker is on.

        ``rank`` (0 ready, 1 claimable, 2 wait: ``tunectl.orchestrator.compile_schedule``) says how the
        asking worker gets an item's kernel. With it: a ready item anywhere first (in that order of
        points), else the first claimable one (load balance before affinity: the worker compiles it
        itself), else None, while every item left waits for a kernel being built.
        """
        if self.retry:
            self.size -= 1
            return self.retry.popleft()
        back = [p for p in reversed(recent) if p != point and p in self.groups and p not in busy]
        if rank is None:
            free = (p for p in self.groups if p not in busy)
            key = point if point in self.groups else next(itertools.chain(back, free), None)
            if key is None:
                key = max(self.groups, key=lambda p: len(self.groups[p]), default=None)
            return None if key is None else self._take(key, 0)
        free = (p for p in self.groups if p not in busy and p != point and p not in back)
        near = [*([point] if point in self.groups else []), *back, *itertools.islice(free, _SCAN_POINTS)]
        found = self._first(near, rank)
        if found is None and len(near) < len(self.groups):  # only points other workers are on are left
            found = self._first([max(self.groups, key=lambda p: len(self.groups[p]))], rank)
        return None if found is None else self._take(*found)

    def _first(self, points: list[Any], rank: Callable[[WorkItem], int]) -> tuple[Any, int] | None:
        """The first ready item over ``points`` (in order), else the first claimable one."""
        claimable = None
        for key in points:
            best = self._best(key, rank)
            if best is not None and best[0] == 0:
                return key, best[1]
            if best is not None and claimable is None:
                claimable = key, best[1]
        return claimable

    def pop_same_point(self, point: Any, rank: Callable[[WorkItem], int] | None = None) -> WorkItem | None:
        """The next item at ``point``, for a worker to prepare ahead; with ``rank``, only one whose
        kernel is built (a worker loads ahead, never compiles beside a measurement)."""
        if point not in self.groups:
            return None
        if rank is None:
            return self._take(point, 0)
        best = self._best(point, rank)
        return self._take(point, best[1]) if best is not None and best[0] == 0 else None

    def pop_batch_mates(
        self, first: WorkItem, limit: int, rank: Callable[[WorkItem], int] | None = None
    ) -> list[WorkItem]:
        """Up to ``limit`` items waiting at ``first``'s point that may share its batch (the same kind
        of look: ``WorkItem.batches_with``), among the first few there; with ``rank``, only those whose
        kernels are built (a batch never waits on a compile)."""
        group = self.groups.get(first.point)
        if group is None or limit <= 0:
            return []
        picks = [
            i
            for i, item in enumerate(itertools.islice(group, _SCAN_ITEMS))
            if first.batches_with(item) and (rank is None or rank(item) == 0)
        ][:limit]
        return [self._take(first.point, i - n) for n, i in enumerate(picks)]

    def _take(self, key: Any, index: int) -> WorkItem:
        group = self.groups[key]
        item = group[index]
        del group[index]
        if not group:
            del self.groups[key]
        self.size -= 1
        return item

    def _best(self, key: Any, rank: Callable[[WorkItem], int]) -> tuple[int, int] | None:
        """(rank, index) of the best-ranked item among the first few of a point's group; None: all wait."""
        best = None
        for i, item in enumerate(itertools.islice(self.groups[key], _SCAN_ITEMS)):
            r = rank(item)
            if r == 0:
                return 0, i
            if r == 1 and best is None:
                best = 1, i
        return best


def failure_records(run_id: str, item: WorkItem, status: Status | str, message: str) -> list[Record]:
    """Records for an item that got no result from a worker (crash, timeout, a failed call): one per
    record it would have had (``tunectl.measure.records``)."""
    if item.members:
        return [r for m in item.members for r in failure_records(run_id, m, status, message)]
    context = CallContext.of(run_id, item, started_at=time.time())
    return [failed(context, member, status, message) for member in members_of(item)]


def describe(item: WorkItem) -> str:
    """An item as a person reads it in a log: its config at its shape (a batch: how many looks, and
    the first's config)."""
    text = f"{key_text(item.config)} at {key_text(item.shape)}"
    if item.members:
        first = key_text(item.config)
        text = f"a batch of {len(item.members)} looks at {key_text(item.shape)}, the first {first}"
    return text if len(text) <= 200 else text[:197] + "..."
