"""Handing out a run's work items to its workers, the dispatcher's half that holds its state
(``tunectl.orchestrator.dispatch`` waits on the calls and recovers from faults).

Work is split into *lanes*, one per pool of workers (an accelerator type); a lane's items go only to
its own workers. Each worker has at most ``prefetch`` calls in flight and gets new work as its
results come back, so a fast GPU never waits on a slow one. A worker stays on one (static, shape)
point while the point has items, so it builds the point's inputs once, and then goes back to the
points it was at lately (their next rung, their finals) before new ones: it keeps what it built
there (``tunectl.measure.built``). A worker gets work only once
it has answered a first call: startup (importing torch, a CUDA context) does not count against an
item's deadline.

A lane's items are drawn from its work (a search) only as its queue runs low
(``tunectl.orchestrator.feed``): the driver holds the items in flight and a bounded look-ahead,
never the whole plan. With ``compile_ahead``, each call also names the item this worker gets next
(held back for it), so the worker can prepare (compile) that item while it times the current one.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tunectl.core.plan import WorkItem, batch
from tunectl.core.record import Record, Status
from tunectl.core.spec import DEFAULT_BATCH, MeasureSpec
from tunectl.orchestrator.blame import Blame, Verdict
from tunectl.orchestrator.compile_schedule import BuildScheduler
from tunectl.orchestrator.feed import Lane, LaneFeed
from tunectl.orchestrator.slots import Call, Slot
from tunectl.orchestrator.workqueue import failure_records

log = logging.getLogger("tunectl.run")


@dataclass(frozen=True, kw_only=True)
class DispatchOptions:
    prefetch: int = 2  # calls in flight per worker
    batch: int = DEFAULT_BATCH  # a point's looks of one kind sent to a worker in one call, at most
    compile_ahead: bool = False
    poll_s: float = 0.25  # how often deadlines are checked while nothing completes
    stall_timeout_s: float = 900.0  # work left but no worker able to take it for this long: give up


@dataclass
class DispatchStats:
    num_records: int = 0
    num_worker_failures: int = 0
    num_requeued: int = 0
    num_lost_workers: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    #: each worker process's start-up as it reported it (``TuneWorker.startup``), by ``host:pid``: the
    #: name its records carry
    startups: dict[str, dict[str, Any]] = field(default_factory=dict)


class Handout:
    """The dispatcher's state (its lanes' feeds, a slot per worker, every pending ref's owner) and how
    it hands out work: each item's records are passed on exactly once, and each answer lets the lane's
    workers take more."""

    def __init__(
        self,
        lanes: Sequence[Lane],
        run_id: str,
        settings: MeasureSpec,
        on_records: Callable[[list[Record]], None],
        options: DispatchOptions,
        builds: BuildScheduler | None = None,
    ) -> None:
        self.run_id, self.settings, self.on_records, self.options = run_id, settings, on_records, options
        self.builds = builds
        self.feeds = {lane.name: LaneFeed(lane, builds) for lane in lanes}
        self.slots = [
            Slot(w, lane.name, f"{lane.name}#{i}") for lane in lanes for i, w in enumerate(lane.workers)
        ]
        self.owner: dict[Any, Slot] = {}  # every pending ref (calls and pings) -> its slot
        self.blame = Blame()
        self.recorded: set[str] = set()
        self.stats = DispatchStats()
        for slot in self.slots:
            self._ping(slot)

    def _work_left(self) -> bool:
        for feed in self.feeds.values():
            feed.top_up()
        if any(len(feed) for feed in self.feeds.values()):
            return True
        return any(s.calls or s.reserved or s.limbo for s in self.slots)

    # -- workers coming up -------------------------------------------------------------------------

    def _ping(self, slot: Slot) -> None:
        """Ask the worker where it runs; it gets work once it answers (a lost one stays lost until then)."""
        if slot.state != "lost":
            slot.state = "starting"
        slot.ping_at = 0.0
        slot.ping = slot.worker.describe.remote()
        self.owner[slot.ping] = slot

    # -- results -----------------------------------------------------------------------------------

    def _emit(self, lane: str, records: list[Record]) -> None:
        fresh = [r for r in records if r.item_id not in self.recorded]
        if len(fresh) < len(records):
            log.warning("dropped a second result for item %s", records[0].item_id)  # never expected
        for record in fresh:
            self.recorded.add(record.item_id)
            self.stats.num_records += 1
            self.stats.statuses[record.status] += 1
        if fresh:
            self.on_records(fresh)
            self.feeds[lane].answered(fresh)  # what the search measures next
            self._fill_lane(lane)

    def _settled(self, item: WorkItem) -> None:
        if self.builds is not None:
            for member in item.unbatched():
                self.builds.book.settled(member)

    def _requeue(self, lane: str, verdict: Verdict) -> None:
        self.feeds[lane].requeue(verdict)
        self.stats.num_requeued += len(verdict.innocent) + len(verdict.retry)
        self._fill_lane(lane)

    # -- handing out work --------------------------------------------------------------------------

    def _fill(self, slot: Slot) -> None:
        if slot.state != "ready" or slot.killed_item is not None:
            return
        feed = self.feeds[slot.lane]
        queue = feed.queue
        while len(slot.calls) < self.options.prefetch:
            feed.top_up()
            item, slot.reserved = slot.reserved, None
            if item is None:
                busy = {s.point for s in self.slots if s is not slot and s.lane == slot.lane}
                item = queue.pop(slot.point, busy, self._rank_on(slot), slot.recent)
            if item is None:
                return
            admitted = self._admit(slot, item)
            if admitted is None:
                continue
            item = self._batch(slot, admitted)
            lookahead = None
            if self.options.compile_ahead and not self.blame.is_suspect(item):
                lookahead = slot.reserved = queue.pop_same_point(item.point, self._rank_on(slot))
            if not slot.calls:
                slot.head_since = time.monotonic()
            slot.move_to(item.point)
            ref = slot.worker.run.remote(self.run_id, item, self.settings, lookahead, slot.incarnation)
            slot.calls.append(Call(ref, item, lookahead))
            self.owner[ref] = slot

    def _batch(self, slot: Slot, item: WorkItem) -> WorkItem:
        """``item`` with the looks of the same kind waiting at its point, up to ``options.batch`` in
        one call: the worker checks and times each, under one drift-guard bracket, and returns them
        together (with compile-ahead, preparing each member while the one before it is checked). Not
        suspects (they run alone) or comparisons."""
        limit = self.options.batch - 1
        if limit <= 0 or item.arms or self.blame.is_suspect(item):
            return item
        mates = self.feeds[slot.lane].queue.pop_batch_mates(item, limit, self._rank_on(slot))
        admitted = [a for m in mates if (a := self._admit(slot, m)) is not None]
        return batch([item, *admitted])

    def _rank_on(self, slot: Slot) -> Callable[[WorkItem], int] | None:
        """How ``slot``'s worker gets each item's kernels (``BuildBook.rank``); None: no builds."""
        builds = self.builds
        if builds is None:
            return None
        scope = builds.scope_of(slot.node_id)
        return lambda item: builds.rank(item, scope)

    def _admit(self, slot: Slot, item: WorkItem) -> WorkItem | None:
        """``item`` as it goes to ``slot``'s worker, or None where it is settled here: an item whose
        kernel failed to build is recorded from the build's answer and never sent to a GPU. A
        comparison whose baseline built goes on without the arms that failed (they carry the build's
        answer). An item sent is noted as taken (and as claimed by this worker where no compile
        process is left to build its kernels). A look marked ``skip`` is recorded ``dominated`` here."""
        if item.skip:
            self._emit(slot.lane, failure_records(self.run_id, item, Status.DOMINATED, item.skip))
            return None
        if self.builds is None:
            return item
        scope, book = self.builds.scope_of(slot.node_id), self.builds.book
        book.taken(item)
        failed = book.failure(item, scope)
        if failed is not None and item.arms:
            unbuilt = book.unbuilt_arms(item, scope)
            if unbuilt and unbuilt[0][0] != 0:
                arms = tuple((item.arms[i], status, message) for i, status, message in unbuilt)
                item, failed = replace(item, unbuilt_arms=arms), None
        if failed is None:
            book.claim(item, scope)
            return item
        self._emit(slot.lane, failure_records(self.run_id, item, *failed))
        return None

    def _fill_lane(self, lane: str) -> None:
        for slot in self.slots:
            if slot.lane == lane:
                self._fill(slot)
