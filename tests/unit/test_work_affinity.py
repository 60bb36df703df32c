"""A worker is handed work at the points it was at lately before new ones: it keeps what it built at
its last few points (``tunectl.measure.built``), so a point's next rung or its finals cost it no
set-up, no load and no capture there. The queue and the slots are real; the items are plain."""

from __future__ import annotations

from tunectl.core.keys import make_key
from tunectl.core.plan import WorkItem
from tunectl.measure.built import KEEP_POINTS
from tunectl.orchestrator.compile_schedule import CLAIMABLE, READY
from tunectl.orchestrator.slots import Slot
from tunectl.orchestrator.workqueue import WorkQueue


def at(n: int, variant: int = 0) -> WorkItem:
    config = make_key({"v": variant})
    return WorkItem(f"i{n}-{variant}", "fault_injection", make_key({}), make_key({"n": n}), config, False)


def popped(
    queue: WorkQueue, point: object, recent: list[object], busy: frozenset[object] = frozenset()
) -> str:
    item = queue.pop(point, set(busy), None, recent)
    assert item is not None
    return item.item_id


def test_with_nothing_left_at_its_point_a_worker_goes_back_to_its_newest_recent_point() -> None:
    queue = WorkQueue([at(1), at(2), at(3), at(3, 1)])
    recent = [at(3).point, at(2).point]  # newest last: it was at 3, then at 2
    assert popped(queue, at(9).point, recent) == "i2-0", "2 before 1, the first in the queue"
    assert popped(queue, at(2).point, recent) == "i3-0", "then 3, the older of its recent points"
    assert popped(queue, at(3).point, recent) == "i3-1"
    assert popped(queue, at(3).point, recent) == "i1-0", "then a new point"


def test_a_recent_point_another_worker_is_on_is_left_to_it() -> None:
    queue = WorkQueue([at(1), at(2)])
    assert popped(queue, None, [at(2).point], busy=frozenset({at(2).point})) == "i1-0"


def test_with_builds_a_ready_item_at_a_recent_point_comes_before_one_at_a_new_point() -> None:
    items = [at(1), at(2), at(3)]
    queue = WorkQueue(items)
    ready = {"i1-0", "i3-0"}

    def rank(item: WorkItem) -> int:
        return READY if item.item_id in ready else CLAIMABLE

    got = queue.pop(at(9).point, set(), rank, [at(2).point, at(3).point])
    assert got is not None and got.item_id == "i3-0", "3 is recent and ready; 1 is ready but new"
    got = queue.pop(at(9).point, set(), rank, [at(2).point])
    assert got is not None and got.item_id == "i1-0", "a ready item anywhere before compiling at 2"


def test_a_slot_remembers_as_many_points_as_a_worker_keeps_and_forgets_them_with_its_process() -> None:
    slot = Slot(worker=None, lane="l", name="w")
    for n in (1, 2, 3, 1, 4, 5):
        slot.move_to(at(n).point)
    assert list(slot.recent) == [at(n).point for n in (3, 1, 4, 5)][-KEEP_POINTS:]
    assert slot.point == at(5).point
    slot.drop_calls()
    assert not slot.recent and slot.point is None
