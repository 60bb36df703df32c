"""A lane's points, how their items are named, and what each point still waits for.

A driver feeding a fleet takes a record back every few milliseconds, so what a record costs it must
not grow with the grid: the items of a point are named (their ids hashed) once, and what a point
waits for (``Awaited``) is worked out when its needs change and kept up to date record by record, so
a record costs the work of its own point, never a walk over the others.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tunectl.core.keys import Key, key_text, make_key
from tunectl.core.plan import WorkItem, in_pool, item_id_of_texts
from tunectl.core.record import Phase, Record

Measured = dict[Key, Record]  # a point's records at one fidelity, by config
Names = dict[tuple[Key, int | None, float], WorkItem]  # a point's items by (config, rung, budget)


class Awaited:
    """Items and the records each still waits for (one, or one per arm of a comparison): an item is
    open until all its records are in. The same item added twice counts twice, as a list of them would."""

    def __init__(self) -> None:
        self.left: dict[str, int] = {}  # item id -> its records not in yet
        self.waiting: dict[str, str] = {}  # record id -> its item's id
        self.copies: Counter[str] = Counter()  # item id -> times added while open
        self.open = 0  # items (copies counted) without all their records

    def add(self, item: WorkItem, have: Container[str]) -> bool:
        """Wait for ``item``'s records not in ``have``; whether that is new (False where it has them all,
        or is open already)."""
        ids = [rid for rid in item.record_ids() if rid not in have]
        if not ids:
            return False
        self.copies[item.item_id] += 1
        self.open += 1
        if item.item_id in self.left:
            return False
        self.left[item.item_id] = len(ids)
        self.waiting.update(dict.fromkeys(ids, item.item_id))
        return True

    def arrived(self, rid: str) -> bool:
        """Note that the record ``rid`` is in; whether it was awaited."""
        iid = self.waiting.pop(rid, None)
        if iid is None:
            return False
        self.left[iid] -= 1
        if not self.left[iid]:
            del self.left[iid]
            self.open -= self.copies.pop(iid)
        return True

    def is_open(self, iid: str) -> bool:
        return iid in self.left


@dataclass
class Point:
    """One (static key, shape) point of a lane: its configs, the default first, and its records.

    ``needs`` and ``awaited`` are kept by the search the point belongs to: what the point needs now
    (as of its records) and, of that, what is still without its records."""

    static: Key
    shape: Key
    configs: tuple[Key, ...]
    records: dict[str, Record] = field(default_factory=dict)  # item id -> latest record
    issued: set[str] = field(default_factory=set)
    names: Names = field(default_factory=dict, repr=False, compare=False)
    needs: list[WorkItem] = field(default_factory=list, repr=False, compare=False)
    awaited: Awaited = field(default_factory=Awaited, repr=False, compare=False)
    key_texts: tuple[str, str] = field(default=("", ""), repr=False, compare=False)  # static, shape
    fresh: bool = field(default=False, compare=False)  # needs worked out since it last handed items out
    finished: bool = field(default=False, compare=False)  # every item it needs, finals too, has its records

    @property
    def default(self) -> Key:
        return self.configs[0]

    def done(self, iid: str) -> bool:
        return iid in self.records

    def measured(self, ids: Mapping[Key, str]) -> Measured:
        return {c: self.records[i] for c, i in ids.items() if i in self.records}


@dataclass(frozen=True)
class Looks:
    """How a lane names and asks for measurements: an item per (point, config, fidelity). A point is
    named by its search's ``Looks`` only: each item is made once and kept on the point."""

    task: str
    pool: str | None = None
    # The texts of the configs (by static key: a point's configs are distinct, a grid's need not be) and
    # of the rungs' extras, kept: an item's id is hashed from its keys' texts.
    texts: dict[tuple[Any, ...], str] = field(default_factory=dict, repr=False, compare=False, hash=False)

    def item(self, point: Point, config: Key, rung: int | None = None, budget: float = 1.0) -> WorkItem:
        """A full measurement of ``config`` (budget 1), or a screening look at ``budget`` on ``rung``."""
        made = point.names.get((config, rung, budget))
        if made is None:
            made = point.names[(config, rung, budget)] = self._make(point, config, rung, budget)
        return made

    def look(
        self, point: Point, configs: Sequence[Key], *, rung: int | None = None, budget: float = 1.0
    ) -> list[WorkItem] | Measured:
        """The records of ``configs`` at this fidelity once all are in; else the items still missing."""
        items = {c: self.item(point, c, rung, budget) for c in configs}
        missing = [item for item in items.values() if not point.done(item.item_id)]
        return missing or point.measured({c: i.item_id for c, i in items.items()})

    def pooled(self, iid: str) -> str:
        return iid if self.pool is None else in_pool(iid, self.pool)

    def _make(self, point: Point, config: Key, rung: int | None, budget: float) -> WorkItem:
        if not point.key_texts[0]:
            point.key_texts = (key_text(point.static), key_text(point.shape))
        texts = [*point.key_texts, self._text((point.static, config), lambda: config)]
        if budget < 1.0:
            texts.append(self._text((rung, budget), lambda: make_key({"rung": rung, "budget": budget})))
        iid = self.pooled(item_id_of_texts(self.task, *texts))
        phase = Phase.SCREEN if budget < 1.0 else Phase.MEASURE
        is_default = config == point.default
        return WorkItem(iid, self.task, point.static, point.shape, config, is_default, phase, rung, budget)

    def _text(self, name: tuple[Any, ...], key: Callable[[], Key]) -> str:
        text = self.texts.get(name)
        if text is None:
            text = self.texts[name] = key_text(key())
        return text
