"""Compile ahead: prepare the next item's kernel in a background thread while this one is timed.

The dispatcher tells a worker, with each call, which item it will send next (its *lookahead*). The
item prepared next is the following member of a batch, or after a call's last item the lookahead.
When it is at the same (static, shape) point, its ``prepare`` (where a task compiles or loads) starts
in a background thread as soon as the current item's own kernel is ready, so it runs while the
current item is checked and timed; the device does not wait for the compiler or the loader. An item
at another point is prepared when its turn comes (its inputs do not exist yet).

Only ``prepare`` runs ahead, never the kernel itself, so the timed region shares the device with
nothing. Everything a background preparation raises is re-raised when its item runs, and is
recorded for that item exactly as if it had been prepared inline.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tunectl.core.plan import WorkItem
from tunectl.measure.runner import ItemRunner, timed_prepare
from tunectl.tasks.base import TuningTask


class CompileAheadRunner(ItemRunner):
    """An ``ItemRunner`` that prepares the announced next item while the current one is measured."""

    def __init__(self, device: str = "cpu") -> None:
        super().__init__(device)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compile-ahead")
        self._ahead: dict[str, Future[tuple[Callable[[], Any], float]]] = {}
        self.num_prepared_ahead = 0

    def preparing(self) -> str | None:
        """The id of the item whose preparation is still running in the background, if any."""
        return next((item_id for item_id, f in self._ahead.items() if not f.done()), None)

    def prepare(
        self,
        task: TuningTask,
        item: WorkItem,
        static: dict[str, Any],
        shape: dict[str, Any],
        config: dict[str, Any],
        inputs: Any,
        then: WorkItem | None = None,
    ) -> tuple[Callable[[], Any], float]:
        future = self._ahead.pop(item.item_id, None)
        self._ahead.clear()  # anything else announced earlier will not come to this worker next
        try:
            if future is not None:
                self.num_prepared_ahead += 1
                return future.result()
            return super().prepare(task, item, static, shape, config, inputs)
        finally:
            self._start_next(task, item, then, inputs)  # also when this item's preparation failed

    def _start_next(self, task: TuningTask, item: WorkItem, nxt: WorkItem | None, inputs: Any) -> None:
        if nxt is None or nxt.item_id == item.item_id or nxt.point != item.point or nxt.task != item.task:
            return
        static, shape, config = dict(nxt.static), dict(nxt.shape), dict(nxt.config)
        self._ahead[nxt.item_id] = self._pool.submit(timed_prepare, task, static, shape, config, inputs)
