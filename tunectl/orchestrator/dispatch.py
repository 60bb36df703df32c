"""Dynamic dispatch of work items to workers, in completion order, surviving worker and node faults.

The calls are awaited with ``ray.wait`` and taken as they complete; how items are handed out (lanes,
calls in flight per worker, look-ahead, batches) is ``tunectl.orchestrator.handout``, and what is
checked between completions (deadlines, stalls) is ``tunectl.orchestrator.watch``.

Faults: a worker process that dies has its unanswered items judged once Ray has restarted it
(``tunectl.orchestrator.blame``): the item that killed it is retried once, alone, then recorded as ``crash``;
the others go back to the queue. All items of a worker whose node died go back to the queue. An item
running past the deadline gets its worker killed (Ray restarts it) and is recorded as ``timeout``.
Every item gets exactly one record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from tunectl.core.keys import key_text
from tunectl.core.record import Record
from tunectl.core.spec import MeasureSpec
from tunectl.orchestrator.blame import Verdict, death_detail, first_line
from tunectl.orchestrator.compile_schedule import BuildScheduler
from tunectl.orchestrator.feed import Lane
from tunectl.orchestrator.handout import DispatchOptions, DispatchStats, Handout
from tunectl.orchestrator.notes import LOG_ONLY
from tunectl.orchestrator.slots import WORKER_LOST, Call, Slot, startup_text
from tunectl.orchestrator.watch import LIMBO_TIMEOUT_S, StallWatch, kill_overdue, node_dead
from tunectl.orchestrator.workqueue import describe, failure_records

log = logging.getLogger("tunectl.run")


def dispatch(
    lanes: Sequence[Lane],
    run_id: str,
    settings: MeasureSpec,
    on_records: Callable[[list[Record]], None],
    options: DispatchOptions | None = None,
    builds: BuildScheduler | None = None,
) -> DispatchStats:
    """Run every item of every lane's work; call ``on_records`` once per item with all its records
    (one, or one per arm of a comparison: they are written as a unit), in completion order; every
    record is passed exactly once. A lane's work is drawn from as its workers free up, and told each
    finished item's records (a search choosing what to measure next); the run ends when no lane has
    work left. ``builds``: compile processes that build kernels ahead (``orchestrator.compile_schedule``);
    workers prefer what they built."""
    return _Dispatcher(lanes, run_id, settings, on_records, options or DispatchOptions(), builds).run()


class _Dispatcher(Handout):
    """The work handed out (``Handout``), its calls taken as they complete, and each failed worker's
    items settled (module doc)."""

    def run(self) -> DispatchStats:
        stalls = StallWatch(self.run_id, self.options.stall_timeout_s)
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
                kill_overdue(self.slots, self.settings.deadline_seconds, now)
                self._check_limbo(now)
                for slot in self.slots:
                    if slot.ping_at and now >= slot.ping_at and slot.ping is None:
                        self._ping(slot)
                for lane, feed in self.feeds.items():
                    stalls.check(lane, len(feed), [s for s in self.slots if s.lane == lane], now)
                next_check = now + self.options.poll_s
        return self.stats

    # -- workers coming up -------------------------------------------------------------------------

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
        self.stats.startups[f"{info['host']}:{info['pid']}"] = info.get("startup") or {}
        log.info(  # one line a worker: the run's log, not the console (a fleet has hundreds)
            "worker %s ready: pid %s on %s (node %s, %s)%s",
            *(slot.name, info["pid"], info["host"], info["node_id"][:12], info["device"]),
            startup_text(info.get("startup")),
            extra=LOG_ONLY,
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
        if killed is not None or node_dead(slot.node_id):
            if killed is None:
                _lost_with_node(slot, len(unanswered))
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

    def _check_limbo(self, now: float) -> None:
        """Items of a dead worker that is not coming back (its node is gone, or it takes too long)."""
        for slot in self.slots:
            if not slot.limbo or slot.state == "ready":
                continue
            if node_dead(slot.node_id):
                _lost_with_node(slot, len(slot.limbo))
                innocent, slot.limbo = [item for item, _ in slot.limbo], []
                self._requeue(slot.lane, Verdict(innocent=innocent))
            elif now - slot.limbo_since > LIMBO_TIMEOUT_S:
                self._judge(slot, None)  # judge on what the driver saw; the worker may come back later


def _lost_with_node(slot: Slot, num_items: int) -> None:
    log.warning(
        "worker %s lost with its node %s; its %d item(s) go back to the queue",
        slot.name,
        slot.node_id[:12],
        num_items,
    )
