"""Tuning specs: TOML files validated into frozen dataclasses (every key: ``docs/specs.md``).

A spec names one task, its ``[static]`` grid, one ``[shapes.<dim>]`` table per shape dimension (read
into a ``tunectl.core.shapes.ShapeDim``), its ``[configs]`` grid or grids, and optionally a
``[default]`` config and the ``[measure]``, ``[resources]``, ``[search]`` and ``[select]`` tables.
Each field of those tables carries its type here, and its choices (a ``StrEnum``) or bounds (a
``Rule``) with it: the parser and the documentation read them off the fields. Every error names the
file and the field and is raised as ``SpecError``.
"""

from __future__ import annotations

import tomllib
import typing
from dataclasses import Field, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from tunectl.core.errors import SpecError
from tunectl.core.files import name_problem
from tunectl.core.keys import Key, Value, make_key, product
from tunectl.core.params import Rule
from tunectl.core.record import Timing
from tunectl.core.shapes import ShapeDim
from tunectl.core.spec_grids import GridReader


class L2(StrEnum):
    """The L2 cache before each sample: as the previous call left it, or flushed."""

    WARM = "warm"
    COLD = "cold"


class MeasureMode(StrEnum):
    """How a config is called: as the task serves it (``TuningTask.serving_mode``), eagerly, or by
    CUDA-graph replay."""

    AUTO = "auto"
    EAGER = "eager"
    GRAPH = "graph"


class DriftAction(StrEnum):
    """What the drift guard (``tunectl.measure.drift``) does when a worker's reference shifts: flag the
    rows and measure them again, only flag them, or nothing."""

    REMEASURE = "remeasure"
    FLAG = "flag"
    OFF = "off"


class Strategy(StrEnum):
    """How configs are searched per point (``tunectl.decide.search``)."""

    GRID = "grid"
    HALVING = "halving"


#: strategies earlier versions ran; runs made with them still read (``parse_spec(..., stored=True)``)
RETIRED_STRATEGIES = ("model",)


def _bounded(default: Any, rule: Rule) -> Any:
    """A spec field whose values ``rule`` bounds (checked when a spec is read)."""
    return field(default=default, metadata={"rule": rule})


class _Choices:
    """Turns each field typed as a ``StrEnum`` into that enum's member: ``MeasureSpec(drift="off")``
    holds ``DriftAction.OFF``; a value that is not a member raises ``ValueError``."""

    def __post_init__(self) -> None:
        for name, enum in _choice_fields(type(self)).items():
            value = getattr(self, name)
            if not isinstance(value, enum):
                object.__setattr__(self, name, enum(value))


def _choice_fields(cls: type) -> dict[str, type[StrEnum]]:
    """The fields of ``cls`` typed as a ``StrEnum``, with the enum."""
    found = _CHOICE_FIELDS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        enums = {f.name: hints[f.name] for f in fields(cls)}
        found = {n: t for n, t in enums.items() if isinstance(t, type) and issubclass(t, StrEnum)}
        _CHOICE_FIELDS[cls] = found
    return found


_CHOICE_FIELDS: dict[type, dict[str, type[StrEnum]]] = {}


@dataclass(frozen=True)
class MeasureSpec(_Choices):
    """How each config is timed. Recorded with every measurement."""

    warmup: int = _bounded(3, Rule.integer(0))
    min_samples: int = _bounded(10, Rule.integer(1))
    max_samples: int = _bounded(1000, Rule.integer(1))
    # a time or a noise target of 0 measures nothing
    noise_target: float = _bounded(0.01, Rule.number(0, 1, low_open=True))
    max_seconds: float = _bounded(2.0, Rule.number(0, low_open=True))
    l2: L2 = L2.WARM
    mode: MeasureMode = MeasureMode.AUTO
    #: how a cold-L2 sample on a GPU is timed (``tunectl.measure.timing``)
    timing: Timing = Timing.DIFFERENCE
    drift: DriftAction = DriftAction.REMEASURE
    deadline_seconds: float = _bounded(300.0, Rule.number(0, low_open=True))


@dataclass(frozen=True)
class SearchSpec(_Choices):
    """How configs are chosen per point (``tunectl.decide.search``)."""

    strategy: Strategy = Strategy.GRID
    #: configs timed again against the default, interleaved (0: no finals)
    finalists: int = _bounded(3, Rule.integer(0))
    rounds: int = _bounded(8, Rule.integer(1))  # interleaved rounds in the finals
    #: a config this close to the default (or faster) may reach the finals
    tie: float = _bounded(0.02, Rule.number(0, 1))
    #: halving: keep 1/eta of the configs per rung, give each eta times more time
    eta: int = _bounded(3, Rule.integer(2))
    #: halving: the first rung's share of the spec's measurement time
    min_budget: float = _bounded(0.1, Rule.number(0, 1, low_open=True))
    #: refinement: extra points per static key (>= 1), or a share of the starting points (< 1); 0: off
    refine_budget: float = _bounded(16.0, Rule.number(0))
    #: refinement: a refined point measures the default and the k fastest configs of each tuned point
    #: next to it (along each refined dimension); 0: every config
    refine_shortlist: int = _bounded(0, Rule.integer(0))
    #: probes: once a static key's points are finished and refined, shapes per cell of its grid
    #: measured inside the region the cell serves (``tunectl.decide.probes``); 0: off
    probes: int = _bounded(0, Rule.integer(0))
    #: the configs a probe compares besides the default and the corners' winners
    probe_shortlist: int = _bounded(4, Rule.integer(1))
    #: halving: no first look at a point for a config whose first looks at the points near it (within
    #: twice the shape) read more than this many times their fastest (``tunectl.decide.dominated``); 0: off
    skip_dominated: float = _bounded(2.0, Rule.number(0))

    def rung_budget(self, rung: int) -> float:
        """Halving: a look's share of a full measurement at ``rung``."""
        return min(1.0, self.min_budget * self.eta**rung)


#: a config other than the default wins only when its whole interval clears 1 + this
DEFAULT_MARGIN = 0.02
#: confirming at start-up (``tunectl.measure.confirm``): the widest a cell confirmed along a dimension
#: the shapes leave out spans, by default (the bundle's cells are cut where wider: a 1024-4096 cell is
#: confirmed as 1024-2048 and 2048-4096), each judged at its two edges. In the H200 tuning runs'
#: comparisons a choice made on two ends at most 2x apart lost 0.3-0.6 % at the shapes between them
#: (``benchmarks/studies/cell_transfer.py --ends``); two processes' readings of one shape differ by
#: about 0.3 %.
CELL_SPAN = 2.0


@dataclass(frozen=True)
class SelectSpec:
    """How winners are chosen from the results (``tunectl.decide.select``)."""

    #: practical equivalence: a speedup under 1 + margin does not count
    margin: float = _bounded(DEFAULT_MARGIN, Rule.number(0, 1))


#: a point's looks of one kind in one call to a worker, at most: the drift guard checks once a call
#: (~6 ms on an H200, whatever the batch) and looks every 0.5 s across a batch (docs/measurement.md)
DEFAULT_BATCH = 16


@dataclass(frozen=True)
class ResourceSpec:
    num_gpus: int | None = _bounded(None, Rule.integer(1))  # None: every GPU the cluster has
    accelerator_type: str | None = None
    prefetch: int = _bounded(2, Rule.integer(1, 64))  # work items in flight per worker
    #: a point's looks of one kind sent to a worker in one call, at most (1: a look a call)
    batch: int = _bounded(DEFAULT_BATCH, Rule.integer(1, 64))
    #: the threads a CPU worker times with (None: all its node's cores but one,
    #: ``tunectl.orchestrator.cluster.cpu_threads``)
    cpu_threads: int | None = _bounded(None, Rule.integer(1, 1024))


#: the spec's own tables, by the name a spec gives them
TABLES: dict[str, type] = dict(
    measure=MeasureSpec, resources=ResourceSpec, search=SearchSpec, select=SelectSpec
)
_TOP_LEVEL = {"name", "description", "task", "static", "shapes", "configs", "default", "baselines", *TABLES}


def _rule(f: Field[Any]) -> Rule | None:
    return f.metadata.get("rule")


#: what each number of the spec's own tables may take, by its dotted name (read off the fields)
TABLE_RULES: dict[str, Rule] = {
    f"{table}.{f.name}": rule for table, cls in TABLES.items() for f in fields(cls) if (rule := _rule(f))
}


@dataclass(frozen=True)
class Spec:
    path: str
    name: str
    task: str
    static: tuple[tuple[str, tuple[Value, ...]], ...]
    shapes: tuple[ShapeDim, ...]
    configs: tuple[Key, ...]
    measure: MeasureSpec = field(default_factory=MeasureSpec)
    resources: ResourceSpec = field(default_factory=ResourceSpec)
    search: SearchSpec = field(default_factory=SearchSpec)
    text: str = ""
    select: SelectSpec = field(default_factory=SelectSpec)
    #: the config every other one is measured against, and the one kept where none beats it
    #: (``[default]``); None: the task's own ``default_config``
    default: Key | None = None
    #: (label, config) of the configs ``validate --holdout`` also times and reports (``[baselines]``)
    baselines: tuple[tuple[str, Key], ...] = ()

    def static_grid(self) -> list[Key]:
        return [make_key(p) for p in product(dict(self.static))]

    def shape_grid(self) -> list[Key]:
        return [make_key(p) for p in product({d.name: d.values for d in self.shapes})]

    def ranges(self) -> dict[str, tuple[int, int]]:
        """The declared span of each dimension that has one."""
        return {d.name: d.range for d in self.shapes if d.range is not None}


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file; raise SpecError naming the file and field on any problem."""
    p = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(p, "file", "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(p, "file", f"cannot read it ({exc})") from None
    return parse_spec(text, p, default_name=Path(path).stem)


def parse_spec(text: str, path: str = "<spec>", default_name: str = "spec", *, stored: bool = False) -> Spec:
    """``stored``: the text is a finished run's spec, read for what it tuned (its shapes, buckets and
    configs); a ``[search]`` table naming a strategy this version no longer has reads as the default."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(path, "toml", str(exc)) from None
    search = raw.get("search")
    if stored and isinstance(search, dict) and search.get("strategy") in RETIRED_STRATEGIES:
        raw = {k: v for k, v in raw.items() if k != "search"}
    # A stored spec was checked by the version that ran it: rules added since must not hide its results.
    return _SpecReader(path, check_values=not stored).spec(raw, text, default_name)


class _SpecReader(GridReader):
    """A whole spec: the task-declared parts (``GridReader``), then the spec's own tables."""

    def spec(self, raw: dict[str, Any], text: str, default_name: str) -> Spec:
        unknown = sorted(set(raw) - _TOP_LEVEL)
        if unknown:
            raise self.fail(unknown[0], f"unknown key; expected one of {', '.join(sorted(_TOP_LEVEL))}")
        task = self.task(raw.get("task"))
        name = raw.get("name", default_name)
        problem = name_problem(name) if self.check_values else None
        if problem or not isinstance(name, str):
            raise self.fail("name", f"{name!r} {problem or 'must be a string'}")
        if not isinstance(raw.get("description", ""), str):
            raise self.fail("description", "must be a string")
        rules = task.param_rules
        static = self.static(raw.get("static"), task.static_params, rules)
        shapes = self.shapes(raw.get("shapes"), task.shape_params)
        configs = self.configs(raw.get("configs"), task.config_params, rules)
        measure = self.dataclass_table(MeasureSpec, raw.get("measure", {}), "measure")
        if measure.max_samples < measure.min_samples:
            raise self.fail("measure.max_samples", "need min_samples <= max_samples")
        resources = self.dataclass_table(ResourceSpec, raw.get("resources", {}), "resources")
        search = self.search(raw.get("search", {}))
        if search.refine_budget >= 1 and not float(search.refine_budget).is_integer():
            raise self.fail("search.refine_budget", "a number of points (>= 1) must be whole; a share is < 1")
        if 0 < search.skip_dominated <= 1:
            raise self.fail("search.skip_dominated", "a factor over the fastest: 0 (off) or more than 1")
        if search.probes and not any(d.range for d in shapes):
            raise self.fail(
                "search.probes", "probes measure inside regions: declare range = [lo, hi] in [shapes]"
            )
        select = self.dataclass_table(SelectSpec, raw.get("select", {}), "select")
        default = None if raw.get("default") is None else self.one_config(raw["default"], task, "default")
        baselines = tuple(
            (str(label), self.one_config(v, task, f"baselines.{label}"))
            for label, v in self.table(raw.get("baselines", {}), "baselines").items()
        )
        grids = (static, shapes, configs)
        return Spec(
            self.path, name, task.name, *grids, measure, resources, search, text, select, default, baselines
        )

    def search(self, value: object) -> SearchSpec:
        if isinstance(value, dict) and value.get("strategy") in RETIRED_STRATEGIES:
            raise self.fail("search.strategy", f"{value['strategy']!r} was removed; use 'halving'")
        search: SearchSpec = self.dataclass_table(SearchSpec, value, "search")
        if search.finalists and search.rounds < 2:
            raise self.fail("search.rounds", "finals need at least 2 rounds for an interval")
        return search

    def dataclass_table(self, cls: Any, value: object, fld: str) -> Any:
        """One of the spec's own tables, each value checked by its field's type, choices and rule."""
        table = self.table(value, fld)
        known = {f.name: f for f in fields(cls)}
        for name, v in table.items():
            if name not in known:
                raise self.fail(f"{fld}.{name}", f"unknown key; expected one of {', '.join(known)}")
            table = {**table, name: self.table_value(cls, known[name], v, f"{fld}.{name}")}
        return cls(**table)

    def table_value(self, cls: Any, f: Field[Any], v: object, fld: str) -> object:
        """``v`` as field ``f`` of ``cls`` holds it, or the field and what it takes."""
        enum = _choice_fields(cls).get(f.name)
        default = f.default
        expected = str if enum else type(default) if default is not None else (int if _rule(f) else str)
        ok = isinstance(v, expected) and not (isinstance(v, bool) and expected is not bool)
        if expected is float and isinstance(v, int) and not isinstance(v, bool):
            ok, v = True, float(v)
        if not ok:
            raise self.fail(fld, f"must be {expected.__name__}, not {type(v).__name__}")
        if enum is not None and v not in tuple(enum):
            raise self.fail(fld, f"{v!r} is not one of {', '.join(enum)}")
        rule = _rule(f)
        if rule is not None:
            self.checked((v,), rule, fld)  # type: ignore[arg-type]
        return v
