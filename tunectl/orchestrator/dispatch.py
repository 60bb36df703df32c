"""Dynamic dispatch of work items to workers, in completion order, surviving worker and node faults.

Work is split into *lanes*, one per pool of workers (an accelerator type); a lane's items go only to
its own workers. Each worker has at most ``prefetch`` calls in flight and gets new work as its
results come back (``ray.wait``), so a fast GPU never waits on a slow one. A worker stays on one
(static, shape) point while the point has items, so it builds the point's inputs once. A worker gets
work only once it has answered a first call: startup (importing torch, a CUDA context) does not count
against an item's deadline.

A lane's items are drawn from its work (a search) only as its queue runs low
(``tunectl.orchestrator.feed``): the driver holds the items in flight and a bounded look-ahead,
never the whole plan. With ``compile_ahead``, each call also names the item this worker gets next
(held back for it), so the worker can prepare (compile) that item while it times the current one.

Faults: a worker process that dies has its unanswered items judged once Ray has restarted it
(``tunectl.orchestrator.blame``): the item that killed it is retried once, alone, then recorded as ``crash``;
the others go back to the queue. All items of a worker whose node died go back to the queue. An item
running past the deadline gets its worker killed (Ray restarts it) and is recorded as ``timeout``.
Every item gets exactly one record.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import ray

from tunectl.core.errors import TunectlError
from tunectl.core.keys import key_text
from tunectl.core.plan import WorkItem, batch
from tunectl.core.record import Record
from tunectl.core.spec import MeasureSpec
from tunectl.orchestrator.blame import Blame, Verdict, death_detail, first_line
from tunectl.orchestrator.compile_schedule import BuildScheduler
from tunectl.orchestrator.feed import Lane, LaneFeed
from tunectl.orchestrator.slots import WORKER_LOST, Call, Slot
from tunectl.orchestrator.workqueue import describe, failure_records

LIMBO_TIMEOUT_S = 120.0  # how long a dead worker's items wait for its replacement to say what killed it
log = logging.getLogger("tunectl.run")


class OrchestrationError(TunectlError):
    """The run cannot go on (no worker left to run its items); what was measured is kept."""


@dataclass(frozen=True, kw_only=True)
class DispatchOptions:
    prefetch: int = 2  # calls in flight per worker
    batch: int = 8  # a point's looks of one kind sent to a worker in one call, at most (1: no batches)
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


def dispatch(
    lanes: Sequence[Lane],
    run_id: str,
    settings: MeasureSpec,
    on_records: Callable[[list[Record]], None],
    options: DispatchOptions = DispatchOptions(),
    builds: BuildScheduler | None = None,
) -> DispatchStats:
    """Run every item of every lane's work; call ``on_records`` once per item with all its records
    (one, or one per arm of a comparison: they are written as a unit), in completion order; every
    record is passed exactly once. A lane's work is drawn from as its workers free up, and told each
    finished item's records (a search choosing what to measure next); the run ends when no lane has
    work left. ``builds``: compile processes that build kernels ahead (``orchestrator.compile_schedule``);
    workers prefer what they built."""
    return _Dispatcher(lanes, run_id, settings, on_records, options, builds).run()


class _Dispatcher:
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
        self.idle_since: dict[str, float] = {}
        for slot in self.slots:
            self._ping(slot)

    def run(self) -> DispatchStats:
        next_check = time.monotonic() + self.options.poll_s
        while self._work_left():
            refs = list(self.owner) + (self.builds.refs() if self.builds else [])
            if not refs:  # every worker is down and not yet asked again
                time.sleep(self.options.poll_s)
                ready: list[Any] = []
            else:
                ready, _ = ray.wait(refs, num_returns=1, timeout=self.options.poll_s)
            if ready and len(refs) > 1:  # under load, take everything that is done in one go
                rest = [r for r in refs if r != ready[0]]
                ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            for ref in ready:
                if self.builds is not None and self.builds.owns(ref):
                    self.builds.on_ready(ref)
                    for slot in self.slots:  # a worker may have been waiting for that kernel
                        self._fill(slot)
                else:
                    self._on_ready(ref)
            now = time.monotonic()
            if now >= next_check:
                if self.builds is not None:
                    self.builds.check(now)
                self._check_deadlines(now)
                self._check_limbo(now)
                for slot in self.slots:
                    if slot.ping_at and now >= slot.ping_at and slot.ping is None:
                        self._ping(slot)
                self._check_stalls(now)
                next_check = now + self.options.poll_s
        return self.stats

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

    def _on_ping(self, slot: Slot, ref: Any) -> None:
        slot.ping = None
        try:
            info = ray.get(ref)
        except WORKER_LOST as exc:
            if slot.ping_failed(exc, time.monotonic()):
                self.stats.num_lost_workers += 1
                log.warning("worker %s is lost: %s", slot.name, slot.failure)
                self._judge(slot, None)  # it cannot say what killed it: its items go to the others
            return
        if slot.came_up(info):
            self.stats.num_lost_workers -= 1
        log.info(
            "worker %s ready: pid %s on %s (node %s, %s)",
            slot.name,
            info["pid"],
            info["host"],
            info["node_id"][:12],
            info["device"],
        )
        self._judge(slot, info.get("last_words"))
        self._fill(slot)

    # -- results -----------------------------------------------------------------------------------

    def _on_ready(self, ref: Any) -> None:
        slot = self.owner.pop(ref, None)
        if slot is None:
            return
        if ref == slot.ping:  # refs compare by id (in client mode they are rebuilt per call)
            self._on_ping(slot, ref)
            return
        call = next((c for c in slot.calls if c.ref == ref), None)
        if call is None:
            return  # a call already settled as part of a worker failure
        try:
            records = call.result(self.run_id)
        except WORKER_LOST as exc:
            self._worker_failed(slot, exc)
            return
        if records is None:  # a new process of this worker refused a call meant for the old one
            self._worker_failed(slot, RuntimeError("the worker process was replaced"))
            return
        if call is slot.calls[0]:
            slot.head_since = time.monotonic()
        slot.calls.remove(call)
        self._settled(call.item)
        self._emit(slot.lane, records)
        if slot.killed_item is None:
            self._fill(slot)
        elif not slot.calls:
            # The item finished just as its deadline kill went out; the worker restarts all the same.
            slot.killed_item = None
            self._ping(slot)

    def _emit(self, lane: str, result: Record | list[Record]) -> None:
        records = result if isinstance(result, list) else [result]
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
                item = queue.pop(slot.point, busy, self._rank_on(slot))
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
            slot.point = item.point
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
        process is left to build its kernels)."""
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

    # -- faults ------------------------------------------------------------------------------------

    def _worker_failed(self, slot: Slot, exc: BaseException) -> None:
        """The worker's process (or node) is gone: settle its calls, then wait for it to come back."""
        self.stats.num_worker_failures += 1
        log.info("worker %s failed (%s): %s", slot.name, type(exc).__name__, first_line(exc))
        self._ping(slot)  # first: no work goes to this worker until its new process answers
        calls, reserved, killed = slot.drop_calls()
        for call in calls:
            self.owner.pop(call.ref, None)
        calls = self._settle_finished(slot.lane, calls)
        timed_out = (
            calls[0].item if killed is not None and calls and calls[0].item.item_id == killed else None
        )
        unanswered = [(m, c.lookahead) for c in calls for m in c.item.unbatched() if c.item is not timed_out]
        unanswered += [(reserved, None)] if reserved else []
        if timed_out is not None and timed_out.members:
            # Which member hung is not known: each runs again alone, and the one that hangs times out.
            self.blame.suspects.update(m.item_id for m in timed_out.members)
            self._requeue(slot.lane, Verdict(retry=list(timed_out.members)))
        elif timed_out is not None:
            self._settled(timed_out)
            message = (
                f"ran past the per-item deadline of {self.settings.deadline_seconds:g} s; worker restarted"
            )
            self._emit(slot.lane, failure_records(self.run_id, timed_out, "timeout", message))
        if killed is not None or self._node_dead(slot.node_id):
            if killed is None:
                log.warning(
                    "worker %s lost with its node %s; its %d item(s) go back to the queue",
                    slot.name,
                    slot.node_id[:12],
                    len(unanswered),
                )
            self._requeue(slot.lane, Verdict(innocent=[item for item, _ in unanswered]))
        else:
            slot.limbo, slot.death = unanswered, death_detail(exc)  # judged once the worker is back
            slot.limbo_since = time.monotonic()

    def _settle_finished(self, lane: str, calls: list[Call]) -> list[Call]:
        """Record the calls whose results arrived before the worker died; return the others."""
        while calls:
            ready, _ = ray.wait([calls[0].ref], num_returns=1, timeout=0)
            if not ready:
                break
            try:
                records = calls[0].result(self.run_id)
            except WORKER_LOST:
                break
            if records is None:
                break  # refused by the process that replaced the dead one: it never ran
            self._settled(calls[0].item)
            self._emit(lane, records)
            calls.pop(0)
        return calls

    def _judge(self, slot: Slot, last_words: dict[str, Any] | None) -> None:
        """Decide the fate of a dead worker's unanswered items, from what its process wrote down."""
        if not slot.limbo:
            return
        verdict = self.blame.judge(slot.limbo, last_words)
        slot.limbo = []
        for item in verdict.crashed:
            self._settled(item)
            message = (
                f"the worker process died while running it {self.blame.deaths[item.item_id]} times "
                f"(it was retried alone); Ray: {slot.death}"
            )
            self._emit(slot.lane, failure_records(self.run_id, item, "crash", message))
            log.warning("worker %s died running %s again: recorded as crash", slot.name, describe(item))
        for item in verdict.retry:
            if (arm := verdict.crashed_arm.get(item.item_id)) is not None:
                log.warning(
                    "worker %s died checking %s in the comparison at %s: recorded as crash; the comparison "
                    "runs again without it",
                    slot.name,
                    key_text(arm),
                    key_text(item.shape),
                )
                continue
            log.warning("worker %s died running %s; it runs again, alone", slot.name, describe(item))
        if not verdict.crashed and not verdict.retry:
            why = "between items" if verdict.known else "without a word on what killed it"
            log.warning(
                "worker %s died %s; its %d item(s) go back to the queue",
                slot.name,
                why,
                len(verdict.innocent),
            )
        self._requeue(slot.lane, verdict)

    def _settled(self, item: WorkItem) -> None:
        if self.builds is not None:
            for member in item.unbatched():
                self.builds.book.settled(member)

    def _requeue(self, lane: str, verdict: Verdict) -> None:
        self.feeds[lane].requeue(verdict)
        self.stats.num_requeued += len(verdict.innocent) + len(verdict.retry)
        self._fill_lane(lane)

    def _node_dead(self, node_id: str) -> bool:
        if not node_id:
            return False
        for node in ray.nodes():
            if node.get("NodeID") == node_id:
                return not node.get("Alive", False)
        return True

    def _check_deadlines(self, now: float) -> None:
        for slot in self.slots:
            # a batch has its members' deadlines in all: they run one after the other
            deadline_s = (
                self.settings.deadline_seconds * len(slot.calls[0].item.unbatched()) if slot.calls else 0.0
            )
            if slot.calls and slot.running_past(now, deadline_s):
                slot.killed_item = slot.calls[0].item.item_id
                log.warning(
                    "%s on worker %s ran past its %g s deadline; killing the worker",
                    describe(slot.calls[0].item),
                    slot.name,
                    deadline_s,
                )
                ray.kill(slot.worker, no_restart=False)

    def _check_limbo(self, now: float) -> None:
        """Items of a dead worker that is not coming back (its node is gone, or it takes too long)."""
        for slot in self.slots:
            if not slot.limbo or slot.state == "ready":
                continue
            if self._node_dead(slot.node_id):
                log.warning(
                    "worker %s lost with its node %s; its %d item(s) go back to the queue",
                    slot.name,
                    slot.node_id[:12],
                    len(slot.limbo),
                )
                innocent, slot.limbo = [item for item, _ in slot.limbo], []
                self._requeue(slot.lane, Verdict(innocent=innocent))
            elif now - slot.limbo_since > LIMBO_TIMEOUT_S:
                self._judge(slot, None)  # judge on what the driver saw; the worker may come back later

    def _check_stalls(self, now: float) -> None:
        """A lane with work left and no worker able to take it: wait a while, then give up."""
        for lane, feed in self.feeds.items():
            slots = [s for s in self.slots if s.lane == lane]
            if not len(feed) or any(s.state == "ready" or s.calls for s in slots):
                self.idle_since.pop(lane, None)
                continue
            if all(s.state == "lost" for s in slots):
                raise OrchestrationError(
                    f"every {lane} worker is lost ({slots[0].failure}) with work left; "
                    "finish the run with `tunectl submit --resume RUN_ID` once the cluster is healthy"
                )
            since = self.idle_since.setdefault(lane, now)
            if now - since > self.options.stall_timeout_s:
                raise OrchestrationError(
                    f"no {lane} worker came back for {self.options.stall_timeout_s:.0f} s with work left; "
                    "finish the run with `tunectl submit --resume RUN_ID`"
                )
