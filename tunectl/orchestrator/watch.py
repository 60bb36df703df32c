"""What the dispatcher checks between completions (``tunectl.orchestrator.dispatch``): an item running
past its deadline has its worker killed; a dead worker's items wait only so long for its replacement;
a lane with work left and no worker able to take it is waited on, then given up."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import ray

from tunectl.orchestrator.control import OrchestrationError
from tunectl.orchestrator.slots import Slot
from tunectl.orchestrator.workqueue import describe

LIMBO_TIMEOUT_S = 120.0  # how long a dead worker's items wait for its replacement to say what killed it
log = logging.getLogger("tunectl.run")


def node_dead(node_id: str) -> bool:
    """Whether Ray reports the node gone (or no longer knows it); False for a worker not yet placed."""
    if not node_id:
        return False
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return not node.get("Alive", False)
    return True


def kill_overdue(slots: Sequence[Slot], deadline_seconds: float, now: float) -> None:
    """Kill the worker of each slot whose oldest call ran past its deadline (Ray restarts it); the
    slot notes the item it was killed at."""
    for slot in slots:
        # a batch has its members' deadlines in all: they run one after the other
        deadline_s = deadline_seconds * len(slot.calls[0].item.unbatched()) if slot.calls else 0.0
        if slot.calls and slot.running_past(now, deadline_s):
            slot.killed_item = slot.calls[0].item.item_id
            log.warning(
                "%s on worker %s ran past its %g s deadline; killing the worker",
                describe(slot.calls[0].item),
                slot.name,
                deadline_s,
            )
            ray.kill(slot.worker, no_restart=False)


class StallWatch:
    """Lanes with work left and no worker able to take it: each is waited on for ``timeout_s``, then the
    run gives up (at once where every worker of the lane is lost)."""

    def __init__(self, run_id: str, timeout_s: float) -> None:
        self.run_id, self.timeout_s = run_id, timeout_s
        self.idle_since: dict[str, float] = {}

    def check(self, lane: str, num_waiting: int, slots: Sequence[Slot], now: float) -> None:
        """``num_waiting``: the lane's items waiting; ``slots``: its workers. Raises
        ``OrchestrationError`` when the lane is given up."""
        if not num_waiting or any(s.state == "ready" or s.calls for s in slots):
            self.idle_since.pop(lane, None)
            return
        if all(s.state == "lost" for s in slots):
            raise OrchestrationError(self.run_id, lane, failure=slots[0].failure)
        since = self.idle_since.setdefault(lane, now)
        if now - since > self.timeout_s:
            raise OrchestrationError(self.run_id, lane, waited_s=self.timeout_s)
