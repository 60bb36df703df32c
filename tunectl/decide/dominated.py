"""Looks not taken: a config far behind at every measured point near this one is not looked at here.

Successive halving gives every config a first look at every point, and most of a dense grid's first
looks are of configs far behind the point's fastest (a kernel built for other shapes, a backend slow
at this static key): each still costs loading its kernel (a FlexAttention package, an SDPA backend's
first call, a compile on a cold cache) and a look. Performance moves smoothly between neighbouring
shapes, so a config's first look at a point is *dominated*, and not taken, where at every point of
the same static key already looked at within ``NEAR`` times the shape in every dimension (at least
one), the config's first look read more than ``factor`` (``[search] skip_dominated``, 2 by default)
times the fastest first look there. The default is always looked at (the finals measure against it),
and so is a config with no first look near (new, or failed there), and a member of a split family (a
config with a split count, ``split_params``): export fits each family's wave model to its counts at
every tuned point (``tunectl.decide.rules``), and the counts far from the best teach it as much as
those near it. Replayed without that exemption, the page-16 bundle lost two of its rule entries.

Decided when a point's first looks are issued, from the records then: the item goes out marked, and
the dispatcher records it ``dominated`` with the evidence instead of sending it to a GPU, so the row
says why, the search moves on as for any failed look, and a resumed run finds the row. Replayed on
five recorded H200 runs of dense grids (the accurate page-128 bundle, three times; the page-16 and
page-128 bundles of holdout.md: 17,700 first looks), a factor of 2 within twice the shape left out
9-12 % of the first looks, none of a config within 1 % of its point's winner in the finals (the
nearest read 1.26 times its own point's fastest), and each run's bundle came out the same, entry for
entry and list for list (``benchmarks/studies/dominated_replay.py``,
``benchmarks/results/throughput.md``). On the shipped decode spec's sparse grid nothing is near.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping

from tunectl.core.keys import Key
from tunectl.core.plan import WorkItem
from tunectl.core.record import Phase, Record
from tunectl.decide.points import Point
from tunectl.decide.rules import split_count

#: how far (a factor in every shape dimension) a point may be and still say how a config does here
NEAR = 2.0


class Dominance:
    """The points of a lane by static key and size, and which first looks they make unnecessary."""

    def __init__(self, factor: float, split_params: tuple[str, ...] = ()) -> None:
        self.factor = factor
        self.split_params = split_params
        self._points: dict[Key, dict[tuple[int, ...], Point]] = {}  # static -> sizes -> point
        self._values: dict[Key, list[set[int]]] = {}  # static -> per dimension, the sizes seen
        self._looks: dict[tuple[Key, Key], dict[Key, float]] = {}  # point -> config -> first look (µs)

    def add(self, point: Point) -> None:
        """Know ``point`` (a lane's point, drawn or added)."""
        sizes = _sizes(point.shape)
        if sizes is None or self.factor <= 0:
            return
        self._points.setdefault(point.static, {})[sizes] = point
        values = self._values.setdefault(point.static, [set() for _ in sizes])
        for seen, size in zip(values, sizes, strict=True):
            seen.add(size)
        for record in point.records.values():
            self.took(point, record)

    def took(self, point: Point, record: Record) -> None:
        """Note ``record`` of ``point``: a first look that ran ok, unflagged by the drift guard, says
        how its config does there."""
        if self.factor > 0 and _first_look(record) and record.median_us:
            self._looks.setdefault((point.static, point.shape), {})[record.config] = record.median_us

    def marked(self, point: Point, items: list[WorkItem]) -> list[WorkItem]:
        """``items`` (being issued at ``point``), each dominated first look marked ``skip`` with why."""
        first = [i.config for i in items if i.phase == Phase.SCREEN and i.rung == 0 and not i.arms]
        skip = self.why(point, first) if first else {}
        return [dataclasses.replace(i, skip=skip[i.config]) if i.config in skip else i for i in items]

    def why(self, point: Point, configs: Iterable[Key]) -> dict[Key, str]:
        """Of ``configs`` (first looks at ``point``), those dominated there (module doc), each with the
        evidence as its row will say it."""
        if self.factor <= 0:
            return {}
        near = [(p, looks, min(looks.values())) for p in self._near(point) if (looks := self._looks_at(p))]
        out: dict[Key, str] = {}
        for config in configs:
            if config == point.default or self._split(config):
                continue
            read = [(looks[config] / fastest, p) for p, looks, fastest in near if config in looks]
            if read and min(r for r, _ in read) > self.factor:
                ratio, where = min(read, key=lambda rp: rp[0])
                others = f" and {len(read) - 1} other point(s) near" if len(read) > 1 else ""
                out[config] = (
                    f"not looked at: at {_label(where.shape)}{others} its first look read {ratio:.2f}x "
                    f"the fastest (skip_dominated = {self.factor:g})"
                )
        return out

    def _split(self, config: Key) -> bool:
        return any(split_count(config, param) is not None for param in self.split_params)

    def _looks_at(self, point: Point) -> Mapping[Key, float]:
        return self._looks.get((point.static, point.shape), {})

    def _near(self, point: Point) -> list[Point]:
        """The known points of ``point``'s static key within ``NEAR`` of it in every dimension."""
        sizes = _sizes(point.shape)
        if sizes is None or point.static not in self._points:
            return []
        ranges = [
            sorted(v for v in seen if size / NEAR <= v <= size * NEAR)
            for seen, size in zip(self._values[point.static], sizes, strict=True)
        ]
        known = self._points[point.static]
        found = (known.get(tuple(at)) for at in itertools.product(*ranges) if tuple(at) != sizes)
        return [p for p in found if p is not None]


def _label(shape: Key) -> str:
    return ", ".join(f"{name}={value}" for name, value in shape)


def _sizes(shape: Key) -> tuple[int, ...] | None:
    """The shape's dimensions as positive integers (None where one is not: no distance to measure)."""
    sizes = tuple(v for _, v in shape if isinstance(v, int) and not isinstance(v, bool) and v > 0)
    return sizes if len(sizes) == len(shape) else None


def _first_look(record: Record) -> bool:
    return record.phase == Phase.SCREEN and record.rung == 0 and record.ok and not record.drift
