"""Planning: a spec becomes work items, one per (static, shape, config) point.

Items are grouped by (static, shape) so a worker builds inputs once per point. The task's default
config is always planned (selection needs it). Points the task cannot build (capacity) are
reported, not planned.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunectl.keys import Key, key_digest, make_key
from tunectl.spec import Spec


@dataclass(frozen=True)
class WorkItem:
    """One measurement to make. Crosses Ray calls; holds no tensors."""

    item_id: str
    task: str
    static: Key
    shape: Key
    config: Key
    is_default: bool

    @property
    def point(self) -> tuple[Key, Key]:
        return (self.static, self.shape)


@dataclass(frozen=True)
class Plan:
    spec: Spec
    items: tuple[WorkItem, ...]
    skipped_points: tuple[tuple[Key, Key, str], ...]  # (static, shape, why)


def item_id(task: str, static: Key, shape: Key, config: Key) -> str:
    return key_digest((("task", task),), static, shape, config)


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
