"""Dynamic dispatch of work items to workers, in completion order, surviving worker faults.

Each worker has at most ``prefetch`` items in flight; results are consumed with ``ray.wait`` as
they finish, so a fast GPU never waits on a slow one. A worker is kept on one (static, shape)
point while it has items, so it builds that point's inputs once.

Faults: Ray runs an actor's calls in order, so when a worker dies the oldest of its in-flight
items is the one that was running. That item is retried once on a fresh process and recorded as
``crash`` if it kills a worker again; the others go back to the queue untouched. An item running
past the deadline gets its worker killed (Ray restarts it) and is recorded as ``timeout``.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from tunectl.keys import key_text
from tunectl.plan import WorkItem
from tunectl.record import Record
from tunectl.spec import MeasureSpec

MAX_CRASH_RETRIES = 1


@dataclass
class _Slot:
    worker: Any
    inflight: deque[tuple[Any, WorkItem]] = field(default_factory=deque)
    head_since: float = 0.0  # when the oldest in-flight item started (approximately)
    point: Any = None


class _Queue:
    """Items grouped by point, handed out with affinity to the point a worker is already on."""

    def __init__(self, items: Sequence[WorkItem]) -> None:
        self.groups: OrderedDict[Any, deque[WorkItem]] = OrderedDict()
        for item in items:
            self.groups.setdefault(item.point, deque()).append(item)

    def __len__(self) -> int:
        return sum(len(g) for g in self.groups.values())

    def push_front(self, item: WorkItem) -> None:
        self.groups.setdefault(item.point, deque()).appendleft(item)
        self.groups.move_to_end(item.point, last=False)

    def pop(self, point: Any, busy: set[Any]) -> WorkItem | None:
        if point in self.groups:
            key = point
        else:
            free = [p for p in self.groups if p not in busy]
            key = free[0] if free else max(self.groups, key=lambda p: len(self.groups[p]), default=None)
        if key is None:
            return None
        item = self.groups[key].popleft()
        if not self.groups[key]:
            del self.groups[key]
        return item


def failure_record(run_id: str, item: WorkItem, status: str, message: str) -> Record:
    now = time.time()
    return Record(
        run_id=run_id,
        item_id=item.item_id,
        task=item.task,
        static_key=key_text(item.static),
        shape_key=key_text(item.shape),
        config_key=key_text(item.config),
        is_default=item.is_default,
        status=status,
        message=message,
        started_at=now,
        finished_at=now,
    )


def dispatch(
    workers: Sequence[Any],
    items: Sequence[WorkItem],
    run_id: str,
    settings: MeasureSpec,
    on_record: Callable[[Record], None],
    prefetch: int = 2,
) -> None:
    """Run every item on some worker; call ``on_record`` exactly once per item, in completion order."""
    queue = _Queue(items)
    slots = [_Slot(w) for w in workers]
    crashes: dict[str, int] = {}
    timed_out: set[str] = set()
    deadline_s = settings.deadline_seconds

    def fill() -> None:
        for slot in slots:
            while len(slot.inflight) < prefetch and len(queue):
                busy = {s.point for s in slots if s is not slot}
                item = queue.pop(slot.point, busy)
                if item is None:
                    return
                if not slot.inflight:
                    slot.head_since = time.monotonic()
                slot.point = item.point
                slot.inflight.append((slot.worker.run.remote(run_id, item, settings), item))

    fill()
    while any(s.inflight for s in slots):
        refs = {ref: slot for slot in slots for ref, _ in slot.inflight}
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
        for ref in ready:
            slot = refs[ref]
            if not slot.inflight or slot.inflight[0][0] != ref:
                continue  # already handled as part of a worker failure
            _, item = slot.inflight.popleft()
            slot.head_since = time.monotonic()
            try:
                record = ray.get(ref, timeout=60)
            except RayActorError as exc:
                _worker_failed(slot, item, exc, run_id, queue, crashes, timed_out, on_record)
                continue
            except GetTimeoutError:
                slot.inflight.appendleft((ref, item))
                continue
            on_record(record)
        for slot in slots:
            if slot.inflight and time.monotonic() - slot.head_since > deadline_s:
                timed_out.add(slot.inflight[0][1].item_id)
                ray.kill(slot.worker, no_restart=False)
                slot.head_since = time.monotonic()  # kill once per deadline, not once per loop
        fill()


def _worker_failed(
    slot: _Slot,
    item: WorkItem,
    exc: Exception,
    run_id: str,
    queue: _Queue,
    crashes: dict[str, int],
    timed_out: set[str],
    on_record: Callable[[Record], None],
) -> None:
    """The worker died running ``item``: decide the item's fate, requeue the innocent."""
    for _, other in reversed(slot.inflight):
        queue.push_front(other)
    slot.inflight.clear()
    slot.point = None
    if item.item_id in timed_out:
        on_record(failure_record(run_id, item, "timeout", "ran past the per-item deadline; worker restarted"))
        return
    crashes[item.item_id] = crashes.get(item.item_id, 0) + 1
    if crashes[item.item_id] > MAX_CRASH_RETRIES:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        on_record(failure_record(run_id, item, "crash", f"worker process died twice running it: {detail}"))
    else:
        queue.push_front(item)
