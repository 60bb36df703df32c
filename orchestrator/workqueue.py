"""A lane's work queue, and the records the orchestrator writes for items no worker could report on."""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any

from tunectl.keys import key_text
from tunectl.plan import WorkItem
from tunectl.record import Record

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

    def pop(self, point: Any, busy: set[Any], ready: Callable[[WorkItem], bool] | None = None
            ) -> WorkItem | None:  # fmt: skip
        """A retry first; else an item at ``point``; else one at a point no other worker is on.

        ``ready`` says whether an item's kernel is built where the asking worker runs: among the
        items a rule allows, ready ones go first (a worker keeps its point, and load balance comes
        before it: an unbuilt item still goes out when nothing built is left to take).
        """
        if self.retry:
            self.size -= 1
            return self.retry.popleft()
        if point in self.groups:
            return self._take(point, ready)
        free = list(itertools.islice((p for p in self.groups if p not in busy), _SCAN_POINTS))
        key = None
        if ready is not None:
            key = next((p for p in free if self._first_ready(p, ready) is not None), None)
        if key is None:
            key = free[0] if free else None
        if key is None:
            key = max(self.groups, key=lambda p: len(self.groups[p]), default=None)
        return None if key is None else self._take(key, ready)

    def pop_same_point(self, point: Any) -> WorkItem | None:
        return self._take(point) if point in self.groups else None

    def _take(self, key: Any, ready: Callable[[WorkItem], bool] | None = None) -> WorkItem:
        group = self.groups[key]
        index = self._first_ready(key, ready) if ready is not None else None
        if index:
            item = group[index]
            del group[index]
        else:
            item = group.popleft()
        if not group:
            del self.groups[key]
        self.size -= 1
        return item

    def _first_ready(self, key: Any, ready: Callable[[WorkItem], bool]) -> int | None:
        """The index of the first ready item among the first few of a point's group."""
        for i, item in enumerate(itertools.islice(self.groups[key], _SCAN_ITEMS)):
            if ready(item):
                return i
        return None


def failure_records(run_id: str, item: WorkItem, status: str, message: str) -> list[Record]:
    """Records for an item that got no result from a worker (crash, timeout, a failed call): one, or
    one per arm of a comparison."""
    now = time.time()
    configs = item.arms or (item.config,)
    defaults = [i == 0 for i in range(len(configs))] if item.arms else [item.is_default]
    return [
        Record(
            run_id=run_id,
            item_id=rid,
            task=item.task,
            static_key=key_text(item.static),
            shape_key=key_text(item.shape),
            config_key=key_text(config),
            is_default=is_default,
            status=status,
            message=message,
            phase=item.phase,
            rung=item.rung,
            group_id=item.item_id if item.arms else "",
            rounds=item.rounds or None,
            layers=item.layers or None,
            started_at=now,
            finished_at=now,
        )
        for rid, config, is_default in zip(item.record_ids(), configs, defaults, strict=True)
    ]


def describe(item: WorkItem) -> str:
    """An item as a person reads it in a log: its config at its shape."""
    text = f"{key_text(item.config)} at {key_text(item.shape)}"
    return text if len(text) <= 200 else text[:197] + "..."
