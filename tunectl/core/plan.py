"""Planning: a spec becomes work items, one per (static, shape, config) point.

Items are grouped by (static, shape) so a worker builds inputs once per point. The task's default
config is always planned (selection needs it). Points the task cannot build (capacity) are
reported, not planned.

A plan is never held as its items: a grid of ten million items is counted point by point (its size,
the points skipped), and its points are made one at a time as the search draws them
(``Plan.points``), so planning takes memory in proportion to the static keys and the skipped points.

Planning is the last moment the task is asked anything: what selection, validation and export need
from it later (which configs may win, how shapes bucket, the parameter names) is written into the
run as ``RunFacts``, so they never load a task.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tunectl.core.errors import UserError
from tunectl.core.keys import Key, key_digest, key_text, make_key, text_digest
from tunectl.core.record import Phase
from tunectl.core.registry import PlannedTask, get_task
from tunectl.core.spec import Spec

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
    phase: Phase = Phase.MEASURE
    rung: int | None = None
    budget: float = 1.0
    arms: tuple[Key, ...] = ()
    rounds: int = 0
    layers: int = 0
    #: arms that killed a worker while they were checked here: recorded ``crash``, not run again
    crashed_arms: tuple[Key, ...] = ()
    #: arms whose kernel failed to build, as (arm, status, message): recorded so, not run here
    unbuilt_arms: tuple[tuple[Key, str, str], ...] = ()
    #: a look settled without a GPU: recorded ``dominated`` with this evidence (``tunectl.decide.dominated``)
    skip: str = ""
    #: a batch: plain items of this point, phase, rung and budget sent to a worker as one call, each
    #: measured on its own and recorded under its own id (``batch``)
    members: tuple[WorkItem, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase", Phase(self.phase))

    @property
    def point(self) -> tuple[Key, Key]:
        return (self.static, self.shape)

    def record_ids(self) -> tuple[str, ...]:
        """The item ids its records carry (one per arm for a comparison)."""
        if self.members:
            return tuple(m.item_id for m in self.members)
        return tuple(member_id(self.item_id, a) for a in self.arms) if self.arms else (self.item_id,)

    def unbatched(self) -> tuple[WorkItem, ...]:
        """The plain items of a batch; any other item is itself."""
        return self.members or (self,)

    def batches_with(self, other: WorkItem) -> bool:
        """Whether ``other`` may share a batch with this plain item: the same point and kind of look."""
        return not (self.arms or other.arms or self.members or other.members) and (
            (self.task, self.point, self.phase, self.rung, self.budget)
            == (other.task, other.point, other.phase, other.rung, other.budget)
        )


@dataclass(frozen=True)
class RunFacts:
    """What the decisions need from a run's task, written into the run when it is planned.

    ``unselectable``: (static key text, config key text) pairs measured for reference only, which
    may never win (``TuningTask.selectable``). ``buckets``: each shape dimension's bucket policy;
    ``ranges``: the span (lo, hi) of each dimension that declares one; ``margin``: the spec's
    ``[select] margin`` (None: a run planned before specs had one); ``split_params``: the config
    parameters that are split counts, and ``wave_dims``: the shape dimension whose units run side by
    side and the one cut into splits (``TuningTask.split_params``/``wave_dims``; export fits a rule
    of them, ``tunectl.decide.rules``).
    """

    task: str
    static_params: tuple[str, ...] = ()
    shape_params: tuple[str, ...] = ()
    config_params: tuple[str, ...] = ()
    buckets: tuple[tuple[str, str], ...] = ()
    unselectable: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    ranges: tuple[tuple[str, int, int], ...] = ()
    margin: float | None = None
    split_params: tuple[str, ...] = ()
    wave_dims: tuple[str, ...] = ()

    def selectable(self, static: Key, config: Key) -> bool:
        return not self.unselectable or (key_text(static), key_text(config)) not in self.unselectable

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "static_params": list(self.static_params),
            "shape_params": list(self.shape_params),
            "config_params": list(self.config_params),
            "buckets": dict(self.buckets),
            "unselectable": sorted(map(list, self.unselectable)),
            "ranges": {dim: [lo, hi] for dim, lo, hi in self.ranges},
            "margin": self.margin,
            "split_params": list(self.split_params),
            "wave_dims": list(self.wave_dims),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RunFacts:
        return cls(
            task=str(raw["task"]),
            static_params=tuple(raw.get("static_params", ())),
            shape_params=tuple(raw.get("shape_params", ())),
            config_params=tuple(raw.get("config_params", ())),
            buckets=tuple(sorted(dict(raw.get("buckets", {})).items())),
            unselectable=frozenset((str(s), str(c)) for s, c in raw.get("unselectable", ())),
            ranges=tuple(
                (str(d), int(lo), int(hi)) for d, (lo, hi) in sorted(dict(raw.get("ranges", {})).items())
            ),
            margin=None if raw.get("margin") is None else float(raw["margin"]),
            split_params=tuple(map(str, raw.get("split_params", ()))),
            wave_dims=tuple(map(str, raw.get("wave_dims", ()))),
        )


def selectable_in(facts: Iterable[RunFacts]) -> Any:
    """The rule ``select_winners`` takes: a config may win unless a run of its task says otherwise."""
    barred = {(f.task, *pair) for f in facts for pair in f.unselectable}

    def selectable(task: str, static: Key, config: Key) -> bool:
        return not barred or (task, key_text(static), key_text(config)) not in barred

    return selectable


def item_id(task: str, static: Key, shape: Key, config: Key, *extra: Key) -> str:
    """Stable id of a measurement; ``extra`` tells apart other looks at the same config (a rung)."""
    return item_id_of_texts(task, *map(key_text, (static, shape, config, *extra)))


def item_id_of_texts(task: str, *texts: str) -> str:
    """``item_id`` of the keys whose texts (``key_text``) are ``texts``, static key, shape, config and
    extras in that order: for a caller that names many items of the same keys and keeps their texts."""
    return text_digest(_task_text(task), *texts)


@functools.lru_cache(maxsize=64)
def _task_text(task: str) -> str:
    return key_text((("task", task),))


def in_pool(iid: str, pool: str) -> str:
    """An item's id in one pool of a run that measures every item once per accelerator type."""
    return key_digest((("item", iid), ("pool", pool)))


def member_id(group_id: str, config: Key) -> str:
    """The id of one arm's record in a comparison item."""
    return key_digest((("group", group_id),), config)


def batch(items: Sequence[WorkItem]) -> WorkItem:
    """``items`` (plain, of one point, phase, rung and budget: ``batches_with``) as one call to a
    worker; its records are theirs, under their ids. One item is itself."""
    if len(items) == 1:
        return items[0]
    assert all(items[0].batches_with(i) for i in items[1:]), "a batch holds one point's looks of one kind"
    iid = key_digest(make_key({"batch": tuple(i.item_id for i in items)}))
    return dataclasses.replace(items[0], item_id=iid, members=tuple(items))


def comparison(
    task: str, static: Key, shape: Key, arms: tuple[Key, ...], phase: Phase, rounds: int, layers: int = 0
) -> WorkItem:
    """An item comparing ``arms`` (the baseline first) at one point, interleaved on one device."""
    arms_text = tuple(map(key_text, arms))
    extra = make_key({"phase": str(Phase(phase)), "rounds": rounds, "layers": layers, "arms": arms_text})
    iid = item_id(task, static, shape, arms[0], extra)
    return WorkItem(iid, task, static, shape, arms[0], True, phase, None, 1.0, arms, rounds, layers)


def full_config(task: PlannedTask, config: Mapping[str, Any]) -> Key:
    """``config`` with the options it leaves implicit filled in, so two spellings plan as one."""
    return make_key(task.complete_config(dict(config)))


def default_of(task: PlannedTask, static: Key, spec_default: Key | None = None) -> Key:
    """The config everything is measured against at ``static``: the spec's ``[default]``, else the task's."""
    config = dict(spec_default) if spec_default is not None else task.default_config(dict(static))
    return full_config(task, config)


def configs_of(
    task: PlannedTask, static: Key, given: Iterable[Key], spec_default: Key | None = None
) -> tuple[Key, list[Key]]:
    """The default config at ``static`` and the distinct configs to plan there, the default first."""
    default = default_of(task, static, spec_default)
    return default, list(dict.fromkeys([default, *(full_config(task, dict(c)) for c in given)]))


Planned = tuple[Key, Key, tuple[Key, ...]]  # (static, shape, its configs: the default first)


@dataclass(frozen=True)
class PlanCount:
    """What a spec plans, counted without making its items (``submit --dry-run``, the size guard)."""

    spec: Spec
    per_static: tuple[tuple[Key, int, int], ...]  # (static key, points, items)
    skipped_points: tuple[tuple[Key, Key, str], ...]

    @property
    def num_items(self) -> int:
        return sum(n for _, _, n in self.per_static)


@dataclass(frozen=True)
class Plan:
    """A spec's planned work, held as its rule, never as its items: ``points()`` makes them one
    point at a time, in the same order every call. ``count`` says how many there are (and which
    points the task cannot build); ``configs`` gives each static key's configs, the default first."""

    spec: Spec
    task: PlannedTask
    count: PlanCount
    configs: tuple[tuple[Key, tuple[Key, ...]], ...]  # (static key, its configs, the default first)
    facts: RunFacts

    @property
    def num_items(self) -> int:
        return self.count.num_items

    @property
    def skipped_points(self) -> tuple[tuple[Key, Key, str], ...]:
        return self.count.skipped_points

    @property
    def all_configs(self) -> tuple[Key, ...]:
        """Every distinct config the plan measures, over its static keys (defaults included)."""
        return tuple(dict.fromkeys(c for _, configs in self.configs for c in configs))

    def points(self) -> Iterator[Planned]:
        """Every buildable (static, shape) point with its configs, lazily, static key by static key."""
        for static, configs in self.configs:
            for shape in _buildable(self.spec, self.task, static, None):
                yield static, shape, configs

    def work_items(self) -> Iterator[WorkItem]:
        """The plan's items, one at a time: each point's configs, the default first."""
        for static, shape, configs in self.points():
            for config in configs:
                iid = item_id(self.spec.task, static, shape, config)
                yield WorkItem(iid, self.spec.task, static, shape, config, config == configs[0])


def plan(spec: Spec, task: PlannedTask | None = None) -> Plan:
    """The spec's plan (``task``: default, the registered one), counted point by point and never
    made into items, with the facts the run records; ``UserError`` if it plans nothing."""
    task = task or get_task(spec.task)
    configs = tuple(_configs(spec, task))
    counted = _count(spec, task, configs)
    if not counted.num_items:
        raise _no_work(spec, list(counted.skipped_points))
    return Plan(spec, task, counted, configs, _facts(spec, task, configs))


def _facts(spec: Spec, task: PlannedTask, configs: Iterable[tuple[Key, Sequence[Key]]]) -> RunFacts:
    """What the run records of ``task`` for the decisions; a pass over static keys and configs only."""
    unselectable = frozenset(
        (key_text(static), key_text(c))
        for static, per_static in configs
        for c in per_static
        if not task.selectable(dict(static), dict(c))
    )
    return RunFacts(
        task=spec.task,
        static_params=tuple(task.static_params),
        shape_params=tuple(task.shape_params),
        config_params=tuple(task.config_params),
        buckets=tuple((d.name, d.bucket) for d in spec.shapes),
        unselectable=unselectable,
        ranges=tuple((dim, lo, hi) for dim, (lo, hi) in sorted(spec.ranges().items())),
        margin=spec.select.margin,
        split_params=tuple(getattr(task, "split_params", ())),
        wave_dims=tuple(getattr(task, "wave_dims", ())),
    )


def count_plan(spec: Spec, task: PlannedTask | None = None) -> PlanCount:
    """The items ``plan(spec)`` makes per static key, in memory proportional to the static keys and
    the skipped points only."""
    task = task or get_task(spec.task)
    return _count(spec, task, _configs(spec, task))


def _configs(spec: Spec, task: PlannedTask) -> Iterator[tuple[Key, tuple[Key, ...]]]:
    """Each static key's configs, the default first."""
    for static in spec.static_grid():
        yield static, tuple(configs_of(task, static, spec.configs, spec.default)[1])


def _count(spec: Spec, task: PlannedTask, configs: Iterable[tuple[Key, Sequence[Key]]]) -> PlanCount:
    skipped: list[tuple[Key, Key, str]] = []
    per_static = []
    for static, per_static_configs in configs:
        num_points = sum(1 for _ in _buildable(spec, task, static, skipped))
        per_static.append((static, num_points, num_points * len(per_static_configs)))
    return PlanCount(spec, tuple(per_static), tuple(skipped))


def check_size(spec: Spec, limit: int = CONFIRM_ABOVE_ITEMS) -> None:
    """A ``UserError`` (saying how to go on) if ``spec`` plans more than ``limit`` items."""
    counted = count_plan(spec)
    if counted.num_items > limit:
        raise UserError(
            f"{spec.path}: the spec plans {counted.num_items:,} items (more than {limit:,}); see them with "
            f"`tunectl submit {spec.path} --dry-run`, and run it with --yes"
        )


def _shapes(spec: Spec) -> Iterator[Key]:
    """``spec.shape_grid()`` in the same order, one key at a time (each value normalised once)."""
    dims = sorted(spec.shapes, key=lambda d: d.name)
    pairs = [[make_key({d.name: v})[0] for v in d.values] for d in dims]
    return itertools.product(*pairs)


def _buildable(
    spec: Spec, task: PlannedTask, static: Key, skipped: list[tuple[Key, Key, str]] | None
) -> Iterator[Key]:
    """The shapes the task can build at ``static``; the others into ``skipped`` (None: dropped)."""
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
        elif skipped is not None:
            skipped.append((static, shape, why))


def _no_work(spec: Spec, skipped: list[tuple[Key, Key, str]]) -> UserError:
    reasons = sorted({why for _, _, why in skipped})
    detail = f"; {len(skipped)} point(s) skipped: {'; '.join(reasons[:3])}" if reasons else ""
    return UserError(f"{spec.path}: the spec plans no work{detail}")
