"""Planning: a spec becomes work items, one per (static, shape, config) point.

Items are grouped by (static, shape) so a worker builds inputs once per point. The task's default
config is always planned (selection needs it). Points the task cannot build (capacity) are
reported, not planned.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tunectl.errors import UserError
from tunectl.keys import Key, key_digest, key_text, make_key
from tunectl.spec import Spec

#: a spec planning more items than this runs only once the user confirms it (``submit --yes``)
CONFIRM_ABOVE_ITEMS = 50_000


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
    """Every item of the spec, the task's default config first at each point; ``UserError`` if none."""
    items: list[WorkItem] = []
    skipped: list[tuple[Key, Key, str]] = []
    for static, configs, shapes in _points(spec, skipped):
        for shape in shapes:
            for config in configs:
                iid = item_id(spec.task, static, shape, config)
                items.append(WorkItem(iid, spec.task, static, shape, config, config == configs[0]))
    if not items:
        raise _no_work(spec, skipped)
    return Plan(spec, tuple(items), tuple(skipped))


@dataclass(frozen=True)
class PlanCount:
    """What a spec plans, counted without making its items (``submit --dry-run``, the size guard)."""

    spec: Spec
    per_static: tuple[tuple[Key, int, int], ...]  # (static key, points, items)
    skipped_points: tuple[tuple[Key, Key, str], ...]

    @property
    def num_items(self) -> int:
        return sum(n for _, _, n in self.per_static)


def count_plan(spec: Spec) -> PlanCount:
    """The items ``plan(spec)`` makes per static key, in memory proportional to the points only."""
    skipped: list[tuple[Key, Key, str]] = []
    per_static = []
    for static, configs, shapes in _points(spec, skipped):
        num_points = sum(1 for _ in shapes)
        per_static.append((static, num_points, num_points * len(configs)))
    return PlanCount(spec, tuple(per_static), tuple(skipped))


def check_size(spec: Spec, limit: int = CONFIRM_ABOVE_ITEMS) -> None:
    """A ``UserError`` (saying how to go on) if ``spec`` plans more than ``limit`` items."""
    counted = count_plan(spec)
    if counted.num_items > limit:
        raise UserError(
            f"{spec.path}: the spec plans {counted.num_items:,} items (more than {limit:,}); see them with "
            f"`tunectl submit {spec.path} --dry-run`, and run it with --yes"
        )


def _points(
    spec: Spec, skipped: list[tuple[Key, Key, str]]
) -> Iterator[tuple[Key, list[Key], Iterator[Key]]]:
    """Per static key: its configs (the default first) and its buildable shapes, lazily."""
    from tasks.registry import get_task

    task = get_task(spec.task)
    complete = getattr(task, "complete_config", None)  # fills options a config leaves implicit
    for static in spec.static_grid():
        default = make_key(task.default_config(dict(static)))
        given = [make_key(complete(dict(c))) if complete else c for c in spec.configs]
        configs = list(dict.fromkeys([default, *given]))
        yield static, configs, _buildable(spec, task, static, skipped)


def _shapes(spec: Spec) -> Iterator[Key]:
    """``spec.shape_grid()`` in the same order, one key at a time (a large grid is never held)."""
    dims = sorted(spec.shapes, key=lambda d: d.name)
    for values in itertools.product(*(d.values for d in dims)):
        yield make_key(dict(zip((d.name for d in dims), values, strict=True)))


def _buildable(spec: Spec, task: Any, static: Key, skipped: list[tuple[Key, Key, str]]) -> Iterator[Key]:
    for shape in _shapes(spec):
        try:
            why = task.check_point(dict(static), dict(shape))
        except Exception as exc:  # a task's check that cannot take a value its rules let through
            raise UserError(
                f"{spec.path}: static {key_text(static)}, shape {key_text(shape)}: the task cannot check "
                f"this point ({type(exc).__name__}: {exc})"
            ) from None
        if why is None:
            yield shape
        else:
            skipped.append((static, shape, why))


def _no_work(spec: Spec, skipped: list[tuple[Key, Key, str]]) -> UserError:
    reasons = sorted({why for _, _, why in skipped})
    detail = f"; {len(skipped)} point(s) skipped: {'; '.join(reasons[:3])}" if reasons else ""
    return UserError(f"{spec.path}: the spec plans no work{detail}")
