"""A bundle entry: one tuned point, its config (or rule), and why it won. Standard library only.

``Entry`` is what the bundle writer takes (``tunectl.store.bundle.TaskTable``) and what a loaded
bundle hands out (``Bundle.entry``, ``Bundle.entries``); ``bundle diff`` and ``show``, the report and
the other formats read it. Its keys are typed keys (``tunectl.core.keys.Key``: sorted ``(name,
value)`` pairs, lists as tuples) and its statistics named fields, so a reader never spells a column.

On disk an entry is split in two: its static key, shape, config and rule make its row of the lookup
table (``table_layout``), and its statistics are one column each (``STATISTICS``) in the task's stats
file (``stat_columns``); a loaded table gives it back with ``Entry.from_parts``. The JSON object of
one whole entry (what schema 1 stored, what ``bundle show --entries --json`` prints) converts with
``Entry.from_json`` and ``Entry.to_json``. These are the only conversions: the writer, the reader of
every schema and the commands share them, and text exists at the file's edge alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from tunectl.core.files import canonical_json
from tunectl.core.keys import Key, from_json, key_json, to_json
from tunectl.runtime.rules import WaveRule

#: the parts of an entry its lookup row holds; every other name of an entry's JSON is a statistic
ROW_PARTS = ("static", "shape", "config", "rule")


@dataclass(frozen=True)
class Entry:
    """One tuned point of a task: the config served there and what it was chosen on.

    Statistics an older bundle did not record read as their defaults (None, ``False``, ``""``);
    ``extra`` keeps the statistics this version does not name, as they were read.
    """

    static: Key
    shape: Key
    config: Key  # the config served; for a rule entry, the one its count is filled into
    rule: WaveRule | None = None  # the split count computed from the shape (``tunectl.runtime.rules``)
    is_default: bool = False
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    rel_noise: float | None = None
    num_samples: int | None = None
    default_median_us: float | None = None
    speedup: float | None = None  # over the default (1.0 where the default won); None without one
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    basis: str = ""  # what chose it: final, measure, region, rule
    rounds: int | None = None
    reason: str = ""  # why this config is the entry, in a line
    run_id: str = ""  # the run that measured it
    served_by: Key | None = None  # a filled entry: the tuned point whose winner serves this shape
    candidates: tuple[Key, ...] = ()  # ranked configs a serving process may confirm (the pick first)
    extra: tuple[tuple[str, Any], ...] = ()

    def statistics(self) -> dict[str, Any]:
        """The entry's stats-file values by column name (plain JSON), every ``STATISTICS`` name included."""
        stats = {name: getattr(self, name) for name in STATISTICS}
        stats["served_by"] = None if self.served_by is None else key_json(self.served_by)
        stats["candidates"] = [key_json(c) for c in self.candidates] or None
        return {**stats, **{name: to_json(value) for name, value in self.extra}}

    def to_json(self) -> dict[str, Any]:
        """The whole entry as one JSON object (``rule`` only where it is a rule entry)."""
        rule = {} if self.rule is None else {"rule": self.rule.to_json()}
        parts = {
            "static": key_json(self.static),
            "shape": key_json(self.shape),
            "config": key_json(self.config),
        }
        return {**parts, **rule, **self.statistics()}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Entry:
        """The entry one JSON object describes; KeyError for a missing part, ValueError (or TypeError)
        for a malformed rule."""
        stats = {name: value for name, value in doc.items() if name not in ROW_PARTS}
        rule = doc.get("rule")
        return cls.from_parts(
            json_key(doc["static"]),
            json_key(doc["shape"]),
            json_key(doc["config"]),
            None if rule is None else WaveRule.from_json(rule),
            stats,
        )

    @classmethod
    def from_parts(
        cls, static: Key, shape: Key, config: Key, rule: WaveRule | None, stats: Mapping[str, Any]
    ) -> Entry:
        """An entry from its row's parts and its statistics by column name (None: not recorded)."""
        known = {name: value for name in STATISTICS if (value := stats.get(name)) is not None}
        if "served_by" in known:
            known["served_by"] = json_key(known["served_by"])
        if "candidates" in known:
            known["candidates"] = tuple(json_key(c) for c in known["candidates"])
        if "is_default" in known:
            known["is_default"] = bool(known["is_default"])
        extra = tuple(sorted((n, from_json(v)) for n, v in stats.items() if n not in _NAMED))
        return cls(static, shape, config, rule, **known, extra=extra)


#: the statistics an entry names: one column each in a task's stats file, in this order
STATISTICS = tuple(f.name for f in fields(Entry) if f.name not in (*ROW_PARTS, "extra"))
_NAMED = frozenset((*STATISTICS, *ROW_PARTS))


def json_key(params: Mapping[str, Any]) -> Key:
    """A JSON object of parameters (an entry's static key, shape or config) as a typed key, values
    kept as stored (not normalised again)."""
    return tuple(sorted((name, from_json(value)) for name, value in params.items()))


def stat_columns(entries: Sequence[Entry]) -> dict[str, list[Any]]:
    """The entries' statistics by column: every ``STATISTICS`` name, then any other in the order it
    first appears; None where an entry has none."""
    rows = [entry.statistics() for entry in entries]
    names = dict.fromkeys([*STATISTICS, *(name for row in rows for name in row)])
    return {name: [row.get(name) for row in rows] for name in names}


def table_layout(
    entries: Sequence[Entry], static_params: Sequence[str], shape_params: Sequence[str]
) -> dict[str, list[Any]]:
    """A table's ``statics``, ``configs`` and ``rules`` (each stored once) and its flat ``rows`` of
    (static index, shape values..., config index, rule index or -1), as the table file holds them.

    ``LayoutError`` for an entry that lacks a parameter, or two entries that are one lookup key.
    """
    statics: dict[str, int] = {}
    configs: dict[str, int] = {}
    rules: dict[str, int] = {}
    seen: set[Any] = set()
    rows: list[Any] = []
    for i, entry in enumerate(entries):
        static, shape = _values(entry.static, static_params, i), _values(entry.shape, shape_params, i)
        key = (from_json(static), tuple(shape))
        if key in seen:  # equal as lookup keys (1 == True == 1.0 in Python): one would shadow the other
            raise LayoutError(f"two entries share the key {static!r} {shape!r}")
        seen.add(key)
        s = statics.setdefault(canonical_json(static), len(statics))
        c = configs.setdefault(canonical_json(key_json(entry.config)), len(configs))
        rule = None if entry.rule is None else canonical_json(entry.rule.to_json())
        r = -1 if rule is None else rules.setdefault(rule, len(rules))
        rows += [s, *shape, c, r]
    return {
        "statics": [json.loads(s) for s in statics],
        "configs": [json.loads(c) for c in configs],
        "rules": [json.loads(r) for r in rules],
        "rows": rows,
    }


class LayoutError(ValueError):
    """Entries that cannot make one table."""


def _values(key: Key, params: Sequence[str], at: int) -> list[Any]:
    """The JSON values of ``params`` in ``key``, in that order; LayoutError naming one it lacks."""
    values = dict(key)
    missing = [p for p in params if p not in values]
    if missing:
        raise LayoutError(f"entry {at} lacks {missing[0]!r}")
    return [to_json(values[p]) for p in params]
