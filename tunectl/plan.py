"""Planning: a spec becomes work items, one per (static, shape, config) point.

Items are grouped by (static, shape) so a worker builds inputs once per point. The task's default
config is always planned (selection needs it). Points the task cannot build (capacity) are
reported, not planned.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunectl.keys import Key, key_digest, key_text, make_key
from tunectl.spec import Spec


@dataclass(frozen=True)
class WorkItem:
    """One measurement to make. Crosses Ray calls; holds no tensors.

    A plain item times ``config`` alone (``phase`` measure, or screen with a ``budget`` fraction of
    the spec's measurement time). An item with ``arms`` compares those configs on one device in
    ``rounds`` interleaved rounds, the first arm (the default) as the baseline: ``final`` times each
    call alone, ``validate`` times each arm as a stack of ``layers`` calls with a cache-thrashing
    kernel between them. It yields one record per arm (``member_id``).
    """

    item_id: str
    task: str
    static: Key
    shape: Key
    config: Key
    is_default: bool
    phase: str = "measure"
    rung: int | None = None
    budget: float = 1.0
    arms: tuple[Key, ...] = ()
    rounds: int = 0
    layers: int = 0

    @property
    def point(self) -> tuple[Key, Key]:
        return (self.static, self.shape)

    def record_ids(self) -> tuple[str, ...]:
        """The item ids its records carry (one per arm for a comparison)."""
        return tuple(member_id(self.item_id, a) for a in self.arms) if self.arms else (self.item_id,)


@dataclass(frozen=True)
class Plan:
    spec: Spec
    items: tuple[WorkItem, ...]
    skipped_points: tuple[tuple[Key, Key, str], ...]  # (static, shape, why)


def item_id(task: str, static: Key, shape: Key, config: Key, *extra: Key) -> str:
    """Stable id of a measurement; ``extra`` tells apart other looks at the same config (a rung)."""
    return key_digest((("task", task),), static, shape, config, *extra)


def in_pool(iid: str, pool: str) -> str:
    """An item's id in one pool of a run that measures every item once per accelerator type."""
    return key_digest((("item", iid), ("pool", pool)))


def member_id(group_id: str, config: Key) -> str:
    """The id of one arm's record in a comparison item."""
    return key_digest((("group", group_id),), config)


def comparison(
    task: str, static: Key, shape: Key, arms: tuple[Key, ...], phase: str, rounds: int, layers: int = 0
) -> WorkItem:
    """An item comparing ``arms`` (the baseline first) at one point, interleaved on one device."""
    extra = make_key({"phase": phase, "rounds": rounds, "layers": layers, "arms": tuple(map(key_text, arms))})
    iid = item_id(task, static, shape, arms[0], extra)
    return WorkItem(iid, task, static, shape, arms[0], True, phase, None, 1.0, arms, rounds, layers)


def plan(spec: Spec) -> Plan:
    from tasks.registry import get_task

    task = get_task(spec.task)
    items: list[WorkItem] = []
    skipped: list[tuple[Key, Key, str]] = []
    complete = getattr(task, "complete_config", None)  # fills options a config leaves implicit
    for static in spec.static_grid():
        default = make_key(task.default_config(dict(static)))
        given = [make_key(complete(dict(c))) if complete else c for c in spec.configs]
        configs = list(dict.fromkeys([default, *given]))
        for shape in spec.shape_grid():
            why = task.check_point(dict(static), dict(shape))
            if why is not None:
                skipped.append((static, shape, why))
                continue
            for config in configs:
                iid = item_id(spec.task, static, shape, config)
                items.append(WorkItem(iid, spec.task, static, shape, config, config == default))
    return Plan(spec, tuple(items), tuple(skipped))
