"""A loaded bundle's tables and the lookup built on them. Standard library only."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from operator import itemgetter
from pathlib import Path
from typing import Any

from tunectl.core.buckets import make_bucketer
from tunectl.core.keys import InvalidKeyError, from_json, normalise_value, normaliser_for
from tunectl.runtime.entries import Entry, json_key, stat_columns, table_layout
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
        self.confirmed: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._parts = (
            self.static_params,
            self.dims,
            self.static_ids,
            self.rows,
            (self.row_config, self.row_rule),
        )
        self.find, self.lookup = _finders(*self._parts)

    def with_confirmed(self, picks: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> _TaskIndex:
        """A copy whose lookup answers each pick's config at its exact shape (``Bundle.with_confirmed``)."""
        index = copy.copy(self)
        index.confirmed = dict(self.confirmed)
        find_static = _static_finder(self.static_params, self.static_ids)
        for params, config in picks:
            static = find_static(params)
            if static is None:
                raise ValueError(f"task {self.name}: no static key of this bundle matches {dict(params)}")
            shape = tuple(_integral(params[name]) for name in self.shape_params)
            index.confirmed[(static, *shape)] = dict(config)
        index.find, index.lookup = _finders(*self._parts, index.confirmed)
        return index

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


_MISSING = object()
_Finder = Callable[[Mapping[str, Any]], Any]  # parameters -> what they find (None: a miss)
_MEMO_LIMIT = 1 << 14  # entries a memo holds before it starts afresh (keys drift: kv_len grows each step)
_WINDOW = normaliser_for("window")


def _getter(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    if len(names) > 1:
        return itemgetter(*names)
    if names:
        only = names[0]
        return lambda params: (params[only],)
    return lambda params: ()


def _remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = value


def _integral(value: Any) -> Any:
    """The int an integral bool or float equals; anything else unchanged."""
    if isinstance(value, bool) or (isinstance(value, float) and value.is_integer()):
        return int(value)
    return value


def _lenient_window(value: Any) -> Any:
    """A window as tuning normalises it, but with 5.0 or True taken for the ints they equal."""
    return tuple(map(_integral, value)) if isinstance(value, (tuple, list)) else _integral(value)


def _finders(
    static_params: tuple[str, ...],
    dims: list[tuple[str, Any]],
    static_ids: dict[Any, int],
    rows: dict[tuple[Any, ...], int],
    answers: tuple[list[Any], list[WaveRule | None]],
    confirmed: Mapping[tuple[Any, ...], dict[str, Any]] | None = None,
) -> tuple[_Finder, _Finder]:
    """``find(params) -> row | None`` and ``lookup(params) -> config copy | None``, as closures.

    The hot path is one tuple of the raw parameter values and one hit in a memo of results by those
    values (a serving step looks the same shape up once per layer). A new key resolves through
    smaller memos (static values as given, then normalised, to the static key's index; each
    dimension's value to its bucket) to one hit in the rows by (static index, buckets...); a row
    whose entry is a rule then computes its config from the shape itself (``WaveRule.config``).
    Remembering by value is sound because equal values always resolve alike: the table holds
    normalised values and normalising is idempotent, the window's normaliser is given the int a 5.0
    or a True equals (tuning's own refuses them), buckets take equal values alike
    (``tunectl.core.buckets``), and a rule takes the int a value equals. Every memo is a dict,
    bounded, and safe to share between threads. ``confirmed`` (static index, exact shape values...)
    -> config is consulted before the buckets: picks a serving process confirmed at its own shapes.
    """
    get_all = _getter((*static_params, *(name for name, _ in dims)))
    resolve = _resolver(static_id := _static_finder(static_params, static_ids), dims, rows)
    exact = _exact(static_id, dims, confirmed) if confirmed else None
    configs, rules = answers
    memo: dict[Any, Any] = {}

    def find(params: Mapping[str, Any]) -> Any:
        try:
            get_all(params)
        except KeyError:  # a parameter is missing
            return None
        return resolve(params)

    def answer(params: Mapping[str, Any]) -> Any:
        if exact is not None and (hit := exact(params)) is not None:
            return hit
        row = resolve(params)
        if row is None:
            return None
        rule = rules[row]
        if rule is None:
            return configs[row]
        return {**configs[row], rule.param: rule.count(int(params[rule.across]), int(params[rule.along]))}

    def lookup(params: Mapping[str, Any]) -> Any:  # the hot path
        try:
            key = get_all(params)
        except KeyError:
            return None
        try:
            found = memo.get(key, _MISSING)
        except TypeError:  # an unhashable value: resolve it, remember nothing
            found = answer(params)
        else:
            if found is _MISSING:
                found = answer(params)
                _remember(memo, key, found)
        return None if found is None else found.copy()

    return find, lookup


def _exact(static_id: _Finder, dims: list[tuple[str, Any]], confirmed: Mapping[Any, Any]) -> _Finder:
    """``exact(params)``: the config confirmed at exactly ``params``' static key and shape, or None."""
    get_shape = _getter(tuple(name for name, _ in dims))
    return lambda params: confirmed.get((static_id(params), *map(_integral, get_shape(params))))


def _static_finder(static_params: tuple[str, ...], static_ids: dict[Any, int]) -> _Finder:
    """``static_id(params)``: the index of the static key ``params`` hold, or None. Values as given
    are remembered with the index they normalise to: a new value is normalised once."""
    get_static = _getter(static_params)
    lenient = [(n, _lenient_window if normaliser_for(n) is _WINDOW else None) for n in static_params]
    normalised: dict[Any, Any] = {}

    def static_id(params: Mapping[str, Any]) -> Any:
        raw: Any = get_static(params)
        try:
            found = static_ids.get(raw)
            if found is None:
                found = normalised.get(raw, _MISSING)
            if found is not _MISSING:
                return found
        except TypeError:  # an unhashable value (a list): normalise it, remember nothing
            raw = None
        try:
            key = tuple(normalise_value(n, ease(params[n]) if ease else params[n]) for n, ease in lenient)
            found = static_ids.get(key)
        except (TypeError, InvalidKeyError):
            found = None
        if raw is not None:
            _remember(normalised, raw, found)
        return found

    return static_id


def _resolver(static_id: _Finder, dims: list[tuple[str, Any]], rows: dict[tuple[Any, ...], int]) -> _Finder:
    """``resolve(params)``: the row of (static index, each dimension's bucket), or None; each
    dimension's buckets remembered by value."""
    steps: list[tuple[str, dict[Any, Any], Any]] = [(name, {}, bucket) for name, bucket in dims]

    def resolve(params: Mapping[str, Any]) -> Any:
        found = static_id(params)
        if found is None:
            return None
        key = [found]
        for name, points, bucket in steps:
            value = params[name]
            try:
                point = points.get(value, _MISSING)
                if point is _MISSING:
                    point = bucket(value)
                    _remember(points, value, point)
            except TypeError:  # unhashable: not an integer, a miss
                return None
            if point is None:
                return None
            key.append(point)
        return rows.get(tuple(key))

    return resolve


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
        self, task: str, picks: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]
    ) -> Bundle:
        """A bundle whose ``lookup`` of ``task`` answers each pick's config at its exact shape (each
        pick: the parameters, static and shape, and the config confirmed there), and this bundle's
        answer everywhere else. This bundle is left as it was; ``entry`` still gives the cell's entry."""
        if task not in self._tasks:
            raise KeyError(f"the bundle has no task {task!r}")
        tasks = {**self._tasks, task: self._tasks[task].with_confirmed(picks)}
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
