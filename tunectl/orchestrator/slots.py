"""One worker as the dispatcher sees it: its calls in flight, and whether it is up, restarting or lost.

A worker gets work only once it has answered a ping (``describe``). A ping that gets no answer is
asked again, soon while Ray says the worker is restarting, then ever less often; a worker that stays
silent (``MAX_PING_FAILURES`` answers of a dead process, or ``RESTART_WAIT_S`` of restarting) is
lost until it answers again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import exceptions as rex

from tunectl.core.plan import WorkItem
from tunectl.core.record import Record
from tunectl.measure.built import KEEP_POINTS
from tunectl.orchestrator.blame import first_line
from tunectl.orchestrator.workqueue import failure_records

MAX_PING_FAILURES = 3
# A worker Ray is restarting answers "temporarily unavailable" until its new process is up, which on a
# GPU host (torch, CUDA, the kernel libraries imported at start) takes tens of seconds: it is waited
# for this long before it counts as lost.
RESTART_WAIT_S = 300.0

# Errors that mean the worker process (or its node) is gone, not that the item misbehaved in Python.
WORKER_LOST = (
    rex.RayActorError,
    rex.WorkerCrashedError,
    rex.NodeDiedError,
    rex.OutOfMemoryError,
    rex.ObjectLostError,
    rex.ActorUnschedulableError,
    rex.LocalRayletDiedError,
)

Unanswered = tuple[WorkItem, "WorkItem | None"]  # an item a dead worker held, and its lookahead


@dataclass
class Call:
    ref: Any
    item: WorkItem
    lookahead: WorkItem | None

    def result(self, run_id: str) -> list[Record] | None:
        """The finished call's records: the worker's, or an ``error`` record where the call failed
        outside the task's code; None where a new process of the worker refused a call meant for the
        old one (it never ran). A ``WORKER_LOST`` error where the worker's process died."""
        try:
            records: list[Record] | None = ray.get(self.ref)
        except WORKER_LOST:
            raise
        except rex.RayError as exc:  # the worker survived but its call failed outside the task's code
            return failure_records(run_id, self.item, "error", f"worker call failed: {first_line(exc)}")
        return records


@dataclass
class Slot:
    worker: Any
    lane: str
    name: str
    state: str = "starting"  # starting (waiting for its first answer) | ready | lost
    ping: Any = None
    node_id: str = ""
    calls: deque[Call] = field(default_factory=deque)
    reserved: WorkItem | None = None  # the next item, announced to the worker as its lookahead
    point: Any = None
    #: the points its worker was at lately, newest last: as many as a worker keeps built
    recent: deque[Any] = field(default_factory=lambda: deque(maxlen=KEEP_POINTS))
    head_since: float = 0.0  # when the oldest call started running (approximately)
    killed_item: str | None = None  # set when we killed the worker at this item's deadline
    ping_failures: int = 0
    failing_since: float | None = None  # when its pings started failing (None: answering)
    incarnation: str = ""  # the worker process the calls are meant for (a new one ignores them)
    limbo: list[Unanswered] = field(default_factory=list)  # judged on restart
    limbo_since: float = 0.0
    ping_at: float = 0.0  # when to ask a worker that did not answer again (0: not scheduled)
    failure: str = ""  # why it last did not answer
    death: str = ""  # what Ray said when the worker died

    def ping_failed(self, exc: BaseException, now: float) -> bool:
        """Its ping got no answer: schedule the next; True when the worker is given up as lost now."""
        self.ping_failures += 1
        self.failure = first_line(exc)
        self.failing_since = self.failing_since or now
        restarting = isinstance(exc, rex.ActorUnavailableError)
        # Ask again soon (a restart in progress answers late), then ever less often: Ray may yet
        # restart it elsewhere (a node replaced, a placement group rescheduled).
        self.ping_at = now + min(0.5 * 2.0 ** (self.ping_failures - 1), 5.0 if restarting else 30.0)
        gave_up = (
            now - self.failing_since > RESTART_WAIT_S
            if restarting
            else self.ping_failures >= MAX_PING_FAILURES
        )
        if gave_up and self.state != "lost":
            self.state = "lost"
            return True
        return False

    def came_up(self, info: dict[str, Any]) -> bool:
        """It answered its ping (``info``: where it runs) and takes work; True if it had been lost."""
        was_lost = self.state == "lost"
        self.state, self.node_id, self.ping_failures = "ready", info["node_id"], 0
        self.failing_since = None
        self.incarnation = info["incarnation"]
        return was_lost

    def running_past(self, now: float, deadline_s: float) -> bool:
        """Whether its oldest call has run longer than ``deadline_s`` (and is not being killed yet)."""
        running = self.calls and self.state == "ready" and self.killed_item is None
        return bool(running) and now - self.head_since > deadline_s

    def drop_calls(self) -> tuple[list[Call], WorkItem | None, str | None]:
        """Its process is gone: its calls, the item it was announced next, and the item it was
        killed at, all taken off it."""
        calls, reserved, killed = list(self.calls), self.reserved, self.killed_item
        self.calls.clear()
        self.reserved, self.point, self.killed_item = None, None, None
        self.recent.clear()  # a new process keeps nothing built
        return calls, reserved, killed

    def move_to(self, point: Any) -> None:
        """Its worker goes to ``point`` (the newest of its recent ones)."""
        if point in self.recent:
            self.recent.remove(point)
        self.recent.append(point)
        self.point = point


def startup_text(startup: dict[str, Any] | None) -> str:
    """Where a worker's start-up went (``TuneWorker.startup``), for its ready line; "" if unknown."""
    if not startup:
        return ""
    libraries = startup.get("libraries", {})
    slowest = ", ".join(f"{m} {s:.1f}" for m, s in sorted(libraries.items(), key=lambda kv: -kv[1])[:4])
    parts = [f"{name} {startup.get(name + '_s', 0.0):.1f}" for name in ("process", "imports", "device")]
    parts.append(f"libraries {sum(libraries.values()):.1f}" + (f" ({slowest})" if slowest else ""))
    text = f"; start-up {startup.get('total_s', 0.0):.1f} s: {', '.join(parts)}"
    resident = startup.get("resident")
    if resident:  # its start-up was paid before this run (``tunectl.orchestrator.resident``)
        up = f"; resident, up {resident['up_s']:.0f} s, run {resident['runs']} on it"
        text = f"{up}{text} (before its first run)"
    return text
