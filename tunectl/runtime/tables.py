"""A loaded bundle's tables and the lookup built on them. Standard library only."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tunectl.core.buckets import make_bucketer
from tunectl.core.keys import from_json
from tunectl.runtime.entries import Entry, json_key, stat_columns, table_layout
from tunectl.runtime.finders import Keyer, Layer, finders, layer_keyer, static_finder
from tunectl.runtime.format import SCHEMA_VERSION as SCHEMA
from tunectl.runtime.format import BundleCorruptError, load_json
from tunectl.runtime.rules import WaveRule
from tunectl.runtime.sources import uri_scheme


def _v1_table(spec: Mapping[str, Any], doc: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """A schema-1 table (a list of whole entries) in the schema-3 layout: lookup columns and stats."""
    entries = [Entry.from_json(raw) for raw in doc["entries"]]
    table = table_layout(entries, spec["static_params"], sorted(spec["shape_params"]))
    return table, stat_columns(entries)


class _TaskIndex:
    """One task's table, and the lookup structure built from it once at load."""

    def __init__(
        self, name: str, spec: Mapping[str, Any], table: Mapping[str, Any], stats: Any, schema: int = SCHEMA
    ) -> None:
        self.name = name
        self.static_params = tuple(spec["static_params"])
        shapes = spec["shape_params"]
        self.shape_params = tuple(sorted(shapes))
        self.policies = {
            p: {"policy": shapes[p]["policy"], "points": list(shapes[p]["points"])} for p in shapes
        }
        self.statics = [tuple(from_json(v) for v in s) for s in table["statics"]]
        self.row_static, self.row_shape, self.row_config, self.row_rule = _rows(
            table, len(self.static_params), self.shape_params, schema
        )
        # static key -> its index; (static index, shape values...) -> row: built by C loops alone
        self.static_ids = {static: i for i, static in enumerate(self.statics)}
        self.rows = dict(
            zip(zip(self.row_static, *self.row_shape, strict=True), range(len(self.row_config)), strict=True)
        )
        if len(self.static_ids) != len(self.statics) or len(self.rows) != len(self.row_config):
            raise ValueError("two entries share one key")
        self._stats = stats  # raw bytes until first asked for (serving never asks), then columns
        self._stats_lock = threading.Lock()
        self.dims = [(p, make_bucketer(shapes[p]["policy"], shapes[p]["points"])) for p in self.shape_params]
        # picks confirmed at start-up, by layer (``finders.Layer``: how each dimension is matched),
        # then (static index, each dimension's exact value or cell) -> config
        self.confirmed: dict[Layer, dict[tuple[Any, ...], dict[str, Any]]] = {}
        self._parts = (
            self.static_params,
            self.dims,
            self.static_ids,
            self.rows,
            (self.row_config, self.row_rule),
        )
        self.find, self.lookup = finders(*self._parts)

    def with_confirmed(
        self,
        picks: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]],
        by_cell: Mapping[str, Sequence[int]] | None = None,
    ) -> _TaskIndex:
        """A copy whose lookup answers each pick's config at its shape (``Bundle.with_confirmed``)."""
        by_cell = dict(by_cell or {})
        if unknown := set(by_cell) - set(self.shape_params):
            raise ValueError(f"task {self.name}: no shape dimension {', '.join(sorted(unknown))}")
        layer = tuple(tuple(sorted(set(by_cell[n]))) if n in by_cell else None for n in self.shape_params)
        index = copy.copy(self)
        index.confirmed = {kept: dict(table) for kept, table in self.confirmed.items()}
        table = index.confirmed.setdefault(layer, {})
        key = layer_keyer([self.policies[n]["policy"] for n in self.shape_params], layer)
        find_static = static_finder(self.static_params, self.static_ids)
        for params, config in picks:
            static = find_static(params)
            if static is None:
                raise ValueError(f"task {self.name}: no static key of this bundle matches {dict(params)}")
            if lacking := [name for name in self.shape_params if name not in params]:
                raise ValueError(f"task {self.name}: {dict(params)} lacks {', '.join(lacking)}")
            found = key(static, [params[name] for name in self.shape_params])
            if None in found[1:]:
                raise ValueError(f"task {self.name}: {dict(params)} is in none of the cells confirmed")
            table[found] = dict(config)
        index.find, index.lookup = finders(*self._parts, index.layers())
        return index

    def layers(self) -> list[tuple[Keyer, dict[Any, dict[str, Any]]]]:
        """The confirmed picks' layers as the lookup asks them: exact shapes first, then by how many
        dimensions match by cell, the finest cells first."""
        policies = [self.policies[n]["policy"] for n in self.shape_params]

        def coarseness(layer: Layer) -> tuple[int, int]:
            return sum(p is not None for p in layer), -sum(len(p or ()) for p in layer)

        order = sorted(self.confirmed, key=coarseness)
        return [(layer_keyer(policies, layer), self.confirmed[layer]) for layer in order]

    def __len__(self) -> int:
        return len(self.row_config)

    def stats(self) -> dict[str, list[Any]]:
        with self._stats_lock:
            if isinstance(self._stats, bytes):
                doc = load_json(self._stats, "", "statistics", self.name)
                columns = doc.get("columns") if isinstance(doc, dict) else None
                if not isinstance(columns, dict) or any(len(v) != len(self) for v in columns.values()):
                    why = "not one value per row of the table"
                    raise BundleCorruptError("", why, "statistics", self.name)
                self._stats = columns
            return self._stats or {}

    def entry(self, row: int) -> Entry:
        """The whole entry at ``row``: its keys, config and rule, and its statistics."""
        static = tuple(sorted(zip(self.static_params, self.statics[self.row_static[row]], strict=True)))
        shape = tuple(sorted((p, col[row]) for p, col in zip(self.shape_params, self.row_shape, strict=True)))
        stats = {name: values[row] for name, values in self.stats().items()}
        return Entry.from_parts(static, shape, json_key(self.row_config[row]), self.row_rule[row], stats)


def _rows(
    table: Mapping[str, Any], num_static: int, shape_params: tuple[str, ...], schema: int
) -> tuple[list[int], list[list[Any]], list[dict[str, Any]], list[WaveRule | None]]:
    """The table's rows by column: each row's static index, its value of each shape dimension, its
    config and its rule (None: a plain config); ValueError where they do not fit together."""
    configs: list[dict[str, Any]] = table["configs"]
    if any(len(s) != num_static for s in table["statics"]) or not all(isinstance(c, dict) for c in configs):
        raise ValueError("static keys or configs do not match the task's parameters")
    rules = [WaveRule.from_json(r) for r in table.get("rules", [])] if schema >= 3 else []
    if any({r.across, r.along} - set(shape_params) for r in rules):
        raise ValueError("a rule names a shape dimension the task does not have")
    width = len(shape_params) + (3 if schema >= 3 else 2)
    rows = table["rows"]
    if len(rows) % width:
        raise ValueError(f"rows hold {len(rows)} values, not a multiple of {width}")
    row_static: list[int] = rows[0::width]
    config_ids: list[int] = rows[len(shape_params) + 1 :: width]
    rule_ids: list[int] = rows[width - 1 :: width] if schema >= 3 else []
    for ids, count in ((row_static, len(table["statics"])), (config_ids, len(configs))):
        if ids and (min(ids) < 0 or max(ids) >= count):
            raise ValueError("a row refers to a static key or config the table does not hold")
    if rule_ids and (min(rule_ids) < -1 or max(rule_ids) >= len(rules)):
        raise ValueError("a row refers to a rule the table does not hold")
    row_rule = [rules[r] if r >= 0 else None for r in rule_ids] or [None] * len(config_ids)
    row_shape = [rows[i::width] for i in range(1, len(shape_params) + 1)]
    return row_static, row_shape, [configs[c] for c in config_ids], row_rule


class Bundle:
    """A loaded, verified bundle. Immutable; lookups are thread-safe and do no I/O."""

    def __init__(
        self,
        location: str,
        manifest: Mapping[str, Any],
        tasks: dict[str, _TaskIndex],
        channel: str | None = None,
        environment_problems: tuple[str, ...] = (),
        manifest_sha256: str = "",
    ) -> None:
        self.location = location
        self.manifest_sha256 = manifest_sha256  # which bytes were loaded: what a channel pins
        self.path = Path(location) if uri_scheme(location) is None else None
        self.manifest = manifest
        self.name: str = manifest["name"]
        self.version: str = str(manifest["version"])
        self.channel = channel
        self.environment_problems = environment_problems
        self._tasks = tasks
        self._lookups = {name: index.lookup for name, index in tasks.items()}
        self._num_entries = sum(len(t) for t in tasks.values())

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(sorted(self._tasks))

    def lookup(self, task: str, /, **params: Any) -> dict[str, Any] | None:
        """The tuned config for ``task`` at ``params``, or None on a miss."""
        find = self._lookups.get(task)
        return None if find is None else find(params)  # type: ignore[no-any-return]

    def entry(self, task: str, /, **params: Any) -> Entry | None:
        """The whole table entry (``Entry``: config or rule, statistics, source run), or None on a miss."""
        index = self._tasks.get(task)
        row = index.find(params) if index is not None else None
        return None if row is None or index is None else index.entry(row)

    def candidates(self, task: str, /, **params: Any) -> list[dict[str, Any]]:
        """The configs worth confirming at ``params``: what ``lookup`` answers there first, then the
        cell's other ranked candidates (export's ``--candidates``); [] on a miss."""
        index = self._tasks.get(task)
        row = index.find(params) if index is not None else None
        if row is None or index is None:
            return []
        first = index.lookup(params)
        stored = index.stats().get("candidates", [None] * len(index))[row] or []
        return [first, *[dict(c) for c in stored if c not in (index.row_config[row], first)]]

    def with_confirmed(
        self,
        task: str,
        picks: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]],
        by_cell: Mapping[str, Sequence[int]] | None = None,
    ) -> Bundle:
        """A bundle whose ``lookup`` of ``task`` answers each pick's config at its shape (each pick:
        the parameters, static and shape, and the config confirmed there), and this bundle's answer
        everywhere else. A shape matches exactly in every dimension but those of ``by_cell``, where
        it matches the pick's cell among ``by_cell``'s points for it, under the dimension's own
        policy (a serving process knows its batch sizes, not the lengths to come: a pick confirmed at
        batch 8 and one length serves batch 8 over that length's cell). Exact picks are asked first,
        then the finest cells.
        This bundle is left as it was; ``entry`` still gives the cell's entry."""
        if task not in self._tasks:
            raise KeyError(f"the bundle has no task {task!r}")
        tasks = {**self._tasks, task: self._tasks[task].with_confirmed(picks, by_cell)}
        return Bundle(
            self.location,
            self.manifest,
            tasks,
            self.channel,
            self.environment_problems,
            self.manifest_sha256,
        )

    def entries(self, task: str) -> Iterator[Entry]:
        """Every entry of ``task``, in table order."""
        index = self._tasks[task]
        return (index.entry(row) for row in range(len(index)))

    def task_info(self, task: str) -> dict[str, Any]:
        """``static_params`` and ``shape_params`` (name -> policy and points) of ``task``."""
        index = self._tasks[task]
        return {"static_params": list(index.static_params), "shape_params": dict(index.policies)}

    def check_statistics(self) -> None:
        """Parse every task's statistics now (they are parsed on first use otherwise)."""
        for index in self._tasks.values():
            index.stats()

    def summary(self) -> str:
        env = self.manifest.get("environment", {})
        via = f" (channel {self.channel})" if self.channel else ""
        return (
            f"{self.name}/{self.version}{via} from {self.location}: {len(self)} entries, tasks "
            f"{', '.join(self.tasks) or '-'}; tuned on {env.get('device_name', 'an unrecorded device')}"
        )

    def __len__(self) -> int:
        return self._num_entries

    def __repr__(self) -> str:
        return (
            f"Bundle({self.name!r}, version={self.version!r}, tasks={list(self.tasks)}, entries={len(self)})"
        )


def task_index(name: str, spec: Any, files: Mapping[str, bytes], schema: int) -> _TaskIndex:
    try:
        doc = load_json(files[spec["table"]], "", "table", name)
        if schema == 1:
            table, stats = _v1_table(spec, doc)
            return _TaskIndex(name, spec, table, stats, SCHEMA)
        if doc.get("task") != name or doc.get("schema_version") != schema:
            raise ValueError(
                f"the table file is for {doc.get('task')!r}, schema {doc.get('schema_version')!r}"
            )
        return _TaskIndex(name, spec, doc, files[spec["stats"]] if spec.get("stats") else {}, schema)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise BundleCorruptError("", f"malformed: {exc!r}", "table", name) from None
