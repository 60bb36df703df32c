"""Compile once per node (or per cluster), ahead of the items that need it, off the measuring path.

Each item's compile key (``tunectl.tasks.compile``) names the kernel it needs. The ``BuildBook`` keeps, per
*scope* (a node, or the whole cluster when the compile cache is shared), every key in the order the
dispatcher will want it, and whether it is pending, being built, built (or settled by the cache for a
resident worker in an earlier run: ``known``), failed, or claimed by a worker that compiles it itself. The
``BuildScheduler`` keeps the node's compile processes (``tunectl.orchestrator.compile_process``) busy
with the next pending keys and turns their answers into the book.

What the dispatcher does with it: a worker prefers items whose kernels are built on its node (load
balance first: an idle worker still takes an unbuilt item and compiles it itself, and the builders
then skip that key). An item whose kernel failed to build is recorded from the build's answer
(``compile_error``, ``compile_timeout``, ``invalid``) and never goes to a GPU. Without a shared cache,
node k of M builds every M-th kernel of the order first: nodes build different kernels, and each node's
workers find kernels built for them near the head of the queue.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from ray import exceptions as rex

from tunectl.core.keys import Key
from tunectl.core.plan import WorkItem
from tunectl.orchestrator.blame import death_detail, first_line
from tunectl.orchestrator.notes import LOG_ONLY

log = logging.getLogger("tunectl.run")

SHARED = "*"  # the scope of every node when the compile cache is shared
READY, CLAIMABLE, WAIT = 0, 1, 2  # how a worker sees an item (BuildBook.rank)
MAX_BUILDER_DEATHS = 2  # a kernel whose build killed this many compile processes is a compile_error
MAX_PING_FAILURES = 5  # a compile process that does not answer this often (over ~15 s) is lost

KeyFn = Callable[[WorkItem], "dict[str, Key]"]  # an item's kernels: compile key -> the config that builds it


@dataclass
class _Key:
    item: WorkItem  # the first item that needs it, at whose point a builder builds it
    config: Key  # the config (of the item, or of one arm of a comparison) that builds it
    state: str = "pending"  # pending | building | built | claimed | failed
    claimant: str = ""  # the item whose worker compiles it itself (state claimed)
    status: str = ""  # for failed: compile_error | compile_timeout | invalid
    message: str = ""
    deaths: int = 0
    starved: int = 0  # deaths for want of memory, not the kernel's doing


@dataclass
class BuildBook:
    """Which kernels each scope has, in the order they are wanted. Pure bookkeeping, no Ray."""

    key_fn: KeyFn
    scopes: Sequence[str]
    known: dict[str, set[str]] = field(default_factory=dict)  # scope -> keys settled there before the run
    keys: dict[str, dict[str, _Key]] = field(default_factory=dict)  # scope -> key -> state
    item_keys: dict[str, list[str]] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)  # key -> queued items that need it
    position: dict[str, int] = field(default_factory=dict)  # key -> its place in the order
    seconds: float = 0.0  # compile time spent by builders, all of them
    build_seconds: dict[str, float] = field(default_factory=dict)  # key -> its build's seconds

    def __post_init__(self) -> None:
        self.keys = {scope: {} for scope in self.scopes}

    def add(self, items: Iterable[WorkItem]) -> None:
        """Items entering the queues: their kernels join every scope's order, behind those there."""
        for item in items:
            for key in self._keys(item):
                self.waiting[key] = self.waiting.get(key, 0) + 1

    def taken(self, item: WorkItem) -> None:
        """An item went to a worker: a kernel no queued item needs any more is not built ahead."""
        for key in self._keys(item):
            self.waiting[key] = max(0, self.waiting.get(key, 0) - 1)

    def next_job(self, scope: str, share: tuple[int, int] = (0, 1)) -> tuple[str, WorkItem, Key] | None:
        """The next pending key of ``scope`` that a queued item needs, now building. ``share`` (i, n):
        node i of n builds every n-th kernel of the order first, then helps with the others, so that
        nodes build different kernels and each finds its own near the head of the queue."""
        index, count = share
        first = None
        for key, entry in self.keys[scope].items():
            if entry.state != "pending" or self.waiting.get(key, 0) <= 0:
                continue
            if self.position[key] % count == index:
                first = key
                break
            first = first or key
        if first is None:
            return None
        entry = self.keys[scope][first]
        entry.state = "building"
        return first, entry.item, entry.config

    def finished(self, scope: str, key: str, status: str, seconds: float, message: str = "") -> None:
        entry = self.keys[scope][key]
        if status == "ok":
            entry.state = "built"
            self.build_seconds[key] = round(seconds, 3)
        else:
            entry.state, entry.status, entry.message = "failed", status, message
        self.seconds += seconds

    def died(self, scope: str, key: str, why: str, *, resources: bool = False) -> None:
        """The builder died building ``key``: build it again on a fresh one, once, then give up. A death
        for want of resources (the node's memory) says nothing of the kernel: after a few, the kernel is
        left to the worker that needs it, which compiles it itself."""
        entry = self.keys[scope][key]
        if resources:
            entry.starved += 1
            entry.state = "pending" if entry.starved < MAX_BUILDER_DEATHS + 1 else "built"
            return
        entry.deaths += 1
        if entry.deaths >= MAX_BUILDER_DEATHS:
            entry.state, entry.status = "failed", "compile_error"
            entry.message = f"the compiler process died building this kernel ({entry.deaths} times): {why}"
        else:
            entry.state = "pending"

    def timed_out(self, scope: str, key: str, timeout_s: float) -> None:
        entry = self.keys[scope][key]
        entry.state, entry.status = "failed", "compile_timeout"
        entry.message = (
            f"building this kernel took longer than {timeout_s:g} s; the compile process was killed"
        )

    def rank(self, item: WorkItem, scope: str, *, building: bool = True) -> int:
        """How a worker in ``scope`` should see ``item``: READY (its kernels are built, failed, or need
        no build), WAIT (a kernel is being built, or will be: a crashing or hanging compiler must
        never take a GPU worker down, and waiting costs the GPU no more than compiling itself), or,
        where ``scope`` has no compile process left (``building`` False), CLAIMABLE: the worker
        compiles it itself, as without compile processes."""
        book = self.keys.get(scope, {})
        states = {book[k].state for k in self._keys(item) if k in book}
        if states & {"building", "claimed"}:
            return WAIT
        if "pending" in states:
            return WAIT if building else CLAIMABLE
        return READY

    def failure(self, item: WorkItem, scope: str) -> tuple[str, str] | None:
        """(status, message) where building one of the item's kernels failed."""
        book = self.keys.get(scope, {})
        for key in self._keys(item):
            entry = book.get(key)
            if entry is not None and entry.state == "failed":
                return entry.status, entry.message
        return None

    def unbuilt_arms(self, item: WorkItem, scope: str) -> list[tuple[int, str, str]]:
        """(arm index, status, message) for each arm of a comparison whose kernel failed to build."""
        book = self.keys.get(scope, {})
        unbuilt = []
        for i, arm in enumerate(item.arms):
            for key in self.key_fn(replace(item, config=arm, arms=())):
                entry = book.get(key)
                if entry is not None and entry.state == "failed":
                    unbuilt.append((i, entry.status, entry.message))
                    break
        return unbuilt

    def claim(self, item: WorkItem, scope: str) -> None:
        """A worker compiles ``item``'s pending kernels itself: builders skip them, and other workers
        wait for it rather than compile them too."""
        for key in self._keys(item):
            entry = self.keys.get(scope, {}).get(key)
            if entry is not None and entry.state == "pending":
                entry.state, entry.claimant = "claimed", item.item_id

    def settled(self, item: WorkItem) -> None:
        """``item`` has its records: what its worker compiled for it is in the caches now."""
        self._release(item, "built")

    def returned(self, item: WorkItem) -> None:
        """``item`` went back to the queue unfinished (its worker died): its claims lapse."""
        self._release(item, "pending")
        self.add([item])

    def _release(self, item: WorkItem, state: str) -> None:
        for book in self.keys.values():
            for key in self._keys(item):
                entry = book.get(key)
                if entry is not None and entry.state == "claimed" and entry.claimant == item.item_id:
                    entry.state, entry.claimant = state, ""

    def failures(self) -> Counter[str]:
        """Kernels that failed to build, by status, over every scope."""
        return Counter(v.status for book in self.keys.values() for v in book.values() if v.state == "failed")

    def counts(self) -> tuple[int, int, int]:
        """(built, total, building) over every scope."""
        states = [v.state for book in self.keys.values() for v in book.values()]
        return states.count("built"), len(states), states.count("building")

    def _keys(self, item: WorkItem) -> list[str]:
        keys = self.item_keys.get(item.item_id)
        if keys is None:
            kernels = self.key_fn(item)
            keys = self.item_keys[item.item_id] = list(kernels)
            for key, config in kernels.items():
                self.position.setdefault(key, len(self.position))
                for scope, book in self.keys.items():
                    state = "built" if key in self.known.get(scope, ()) else "pending"
                    book.setdefault(key, _Key(item, config, state))
        return keys


@dataclass
class _Builder:
    actor: Any
    scope: str
    share: tuple[int, int]  # (this node's index, nodes) when each node builds for itself
    name: str
    state: str = "starting"  # starting | ready | busy | lost
    ping: Any = None
    job: tuple[str, float] | None = None  # (key, started)
    ref: Any = None
    ping_failures: int = 0
    ping_at: float = 0.0  # when to ask a restarting process again (0: not scheduled)
    holding: bool = False  # built since it was last told it is idle (it may hold a point's inputs)


class BuildScheduler:
    """Keeps compile processes busy with the book's next pending keys."""

    def __init__(
        self,
        book: BuildBook,
        builders: Sequence[tuple[Any, str]],
        timeout_s: float,
        on_change: Callable[[BuildBook], None] | None = None,
    ) -> None:
        """``builders``: (actor, node id) pairs; node k of M builds every M-th kernel first (``next_job``)."""
        self.book, self.timeout_s, self.on_change = book, timeout_s, on_change
        nodes = sorted({node for _, node in builders})
        shared = list(book.scopes) == [SHARED]
        self.builders = [
            _Builder(
                actor,
                SHARED if shared else node,
                (0, 1) if shared else (nodes.index(node), len(nodes)),
                f"#{i}",
            )
            for i, (actor, node) in enumerate(builders)
        ]
        self._owner: dict[Any, _Builder] = {}
        for b in self.builders:
            self._ping(b)

    def rank(self, item: WorkItem, scope: str) -> int:
        """``BuildBook.rank``, knowing whether ``scope`` still has a compile process."""
        alive = any(b.scope == scope and b.state != "lost" for b in self.builders)
        return self.book.rank(item, scope, building=alive)

    def scope_of(self, node_id: str) -> str:
        """The scope whose kernels a worker on ``node_id`` loads."""
        return SHARED if list(self.book.scopes) == [SHARED] else node_id

    def refs(self) -> list[Any]:
        return list(self._owner)

    def owns(self, ref: Any) -> bool:
        return ref in self._owner

    def on_ready(self, ref: Any) -> None:
        b = self._owner.pop(ref)
        if ref is b.ping:
            self._on_ping(b, ref)
        elif b.job is not None and ref is b.ref:
            self._on_build(b, ref)
        self.pump()

    def pump(self) -> None:
        """Give every idle builder the next pending key of its scope; one with none is told it is idle
        (``Builder.idle``: it lets go of the device memory its last build's point held)."""
        for b in self.builders:
            if b.state != "ready":
                continue
            job = self.book.next_job(b.scope, b.share)
            if job is None:
                if b.holding:  # nothing waits on it; a later build queues behind it
                    b.actor.idle.remote()
                b.holding = False
                continue
            key, item, config = job
            b.state, b.job, b.holding = "busy", (key, time.monotonic()), True
            b.ref = b.actor.build.remote(key, item, config)
            self._owner[b.ref] = b
        self._changed()

    def check(self, now: float) -> None:
        """Kill a builder whose build ran past the timeout (its kernel is a ``compile_timeout``); ask
        restarting ones whether they are back."""
        for b in self.builders:
            if b.ping_at and now >= b.ping_at and b.ping is None:
                b.ping_at = 0.0
                self._ping(b)
            if b.state == "busy" and b.job is not None and now - b.job[1] > self.timeout_s:
                if ray.wait([b.ref], timeout=0)[0]:  # it ended (or died) in time; its answer is waiting
                    self.on_ready(b.ref)
                    continue
                key = b.job[0]
                late = (b.name, _short(key), self.timeout_s)
                log.warning("compile process %s: building %s ran past %g s; killing it", *late)
                self.book.timed_out(b.scope, key, self.timeout_s)
                self._owner.pop(b.ref, None)
                b.job, b.ref = None, None
                ray.kill(b.actor, no_restart=False)
                self._ping(b)
                self._changed()

    # -- internals ---------------------------------------------------------------------------------

    def _ping(self, b: _Builder) -> None:
        b.state = "starting"
        b.ping = b.actor.describe.remote()
        self._owner[b.ping] = b

    def _on_ping(self, b: _Builder, ref: Any) -> None:
        b.ping = None
        try:
            info = ray.get(ref)
        except rex.RayError as exc:  # restarting (answers late), or gone: ask again, less and less often
            b.ping_failures += 1
            if b.ping_failures >= MAX_PING_FAILURES:
                log.warning("compile process %s is lost: %s", b.name, first_line(exc))
                b.state = "lost"
            else:
                b.ping_at = time.monotonic() + 0.5 * 2.0**b.ping_failures
            return
        b.state, b.ping_failures = "ready", 0
        up = (b.name, info["pid"], info["host"], info["device"])  # the run's log only: a fleet has hundreds
        log.info("compile process %s up: pid %s on %s (%s)", *up, extra=LOG_ONLY)

    def _on_build(self, b: _Builder, ref: Any) -> None:
        assert b.job is not None
        key = b.job[0]
        b.job, b.ref = None, None
        try:
            result = ray.get(ref)
        except rex.RayTaskError as exc:  # raised outside the task's build (the process lives on)
            b.state = "ready"
            self.book.finished(
                b.scope, key, "compile_error", 0.0, f"the compile process failed: {first_line(exc)}"
            )
            return
        except rex.RayError as exc:  # the process died building it (a compiler crash, out of memory)
            why = death_detail(exc)
            log.warning("compile process %s died building %s: %s", b.name, _short(key), why)
            self.book.died(b.scope, key, why, resources="memory" in why.lower())
            self._ping(b)  # Ray restarts it; it gets work once it answers
            return
        b.state = "ready"
        self.book.finished(b.scope, key, result.status, result.seconds, result.message)
        if result.status != "ok":
            why = result.message.splitlines()[0]
            log.info(
                "compile process %s: %s for %s: %s", b.name, result.status, _short(key), why, extra=LOG_ONLY
            )

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.book)


def compile_keys(item: WorkItem, tasks: dict[str, Any] | None = None) -> dict[str, Key]:
    """The kernels an item needs, as compile key -> the config that builds it (one per arm of a
    comparison, each once); empty: nothing to build (or a look settled without a GPU, ``skip``)."""
    from tunectl.tasks import compile as build_api
    from tunectl.tasks.registry import get_task

    tasks = {} if tasks is None else tasks
    task = tasks.get(item.task)
    if task is None:
        task = tasks[item.task] = get_task(item.task)
    kernels: dict[str, Key] = {}
    for config in item.arms or (() if item.skip else (item.config,)):
        key = build_api.compile_key(task, dict(item.static), dict(item.shape), dict(config))
        if key is not None:
            kernels.setdefault(key, config)
    return kernels


def key_function() -> KeyFn:
    """``compile_keys`` with the task objects kept between calls."""
    tasks: dict[str, Any] = {}
    return lambda item: compile_keys(item, tasks)


def _short(key: str) -> str:
    return key if len(key) <= 120 else key[:117] + "..."
