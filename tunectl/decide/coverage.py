"""No silent holes: every region a lookup can reach inside the declared ranges maps to an entry.

A bundle's lookup buckets each dimension among every value tuned for it (refined points included),
then asks for the entry at (static key, bucket, bucket, ...). Two things can leave a region without
one: a cell of that grid where a static key has no result of its own (refinement added batch 24 at
one kv length only; the task could not run the point, such as a KV cache over the memory it allows;
every config failed there), and the ends of a declared range that the policy cannot reach (``ceil``
above the largest tuned value). ``cover`` fills each such cell with the entry of a tuned point of
the same static key beside it (``source_for``: the nearer end of a segment through the cell whose two
ends agree, else the nearest corner of a box around it whose corners all agree, else the nearest
point on a line through it, else the nearest of all, by distance in log2 of each dimension),
recorded as such in the entry (``served_by``, and its reason), or, when filling is off, lists it;
range ends it lists always.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tunectl.core.buckets import make_bucketer
from tunectl.core.keys import Key, key_text, make_key, value_order
from tunectl.core.shapes import line_brackets
from tunectl.decide.select import Winner


@dataclass(frozen=True)
class Hole:
    """A region where lookup answers None, and why."""

    task: str
    static: Key | None  # None: every static key of the task
    region: str
    why: str

    def line(self) -> str:
        where = f"static {key_text(self.static)}, " if self.static is not None else ""
        return f"no entry: task {self.task}, {where}{self.region}: {self.why}"


@dataclass(frozen=True)
class Coverage:
    winners: tuple[Winner, ...]  # the tuned entries, then the filled ones
    holes: tuple[Hole, ...]


def cover(
    winners: Sequence[Winner],
    *,
    policies: Mapping[str, Mapping[str, str]],
    ranges: Mapping[str, Mapping[str, tuple[int, int]]],
    unmeasured: Mapping[tuple[str, Key, Key], str] = {},
    fill: bool = True,
) -> Coverage:
    """``winners`` with every grid cell of each (task, static key) filled from a tuned point beside it
    (``fill``), and the regions that still answer None.

    ``policies`` / ``ranges``: per task, each dimension's bucket policy / declared (lo, hi).
    ``unmeasured``: why a (task, static, shape) point has no winner, where the results say (its
    configs failed); other cells are "not measured".
    """
    out: list[Winner] = list(winners)
    holes: list[Hole] = []
    for task in sorted({w.task for w in winners}):
        mine = [w for w in winners if w.task == task]
        dims = [name for name, _ in mine[0].shape]
        points = {d: sorted({sizes(w.shape)[d] for w in mine}) for d in dims}
        holes += _range_ends(task, points, policies.get(task, {}), ranges.get(task, {}))
        for static in sorted({w.static for w in mine}, key=value_order):
            tuned = {w.shape: w for w in mine if w.static == static}
            for values in itertools.product(*(points[d] for d in dims)):
                cell = make_key(dict(zip(dims, values, strict=True)))
                if cell in tuned:
                    continue
                why = unmeasured.get((task, static, cell), "not measured")
                if not fill:
                    holes.append(Hole(task, static, key_text(cell), why))
                    continue
                source = tuned[source_for(cell, tuned)]
                out.append(dataclasses.replace(source, shape=cell, served_by=source.shape, served_why=why))
    return Coverage(tuple(out), tuple(holes))


def sizes(shape: Key) -> dict[str, int]:
    """A shape key's sizes (a shape that reaches selection holds integers only)."""
    out = {}
    for name, value in shape:
        assert isinstance(value, int), f"{name}={value!r} is not a size"
        out[name] = value
    return out


def source_for(cell: Key, tuned: Mapping[Key, Winner]) -> Key:
    """The tuned point whose winner serves ``cell``: where the tuned points on each side of it along a
    dimension (the other values equal) chose the same config, the segment between them is settled
    (refinement stops splitting where neighbours agree), so the nearer of those two serves it; else,
    where the nearest tuned point in every corner around the cell chose the same config, the box
    they span is settled, so the nearest corner serves it; else the nearest tuned point on a line
    through the cell; else the nearest of all."""
    pairs = line_brackets(cell, tuned)
    settled = [
        s
        for lo, hi in pairs
        if lo is not None and hi is not None and tuned[lo].config == tuned[hi].config
        for s in (lo, hi)
    ]
    around = [s for pair in pairs for s in pair if s is not None]
    return nearest(cell, settled or _settled_corners(cell, tuned) or around or list(tuned))


def _settled_corners(cell: Key, tuned: Mapping[Key, Winner]) -> list[Key]:
    """The nearest tuned point in each corner around ``cell`` (at or below / at or above it in every
    dimension), where every corner has one and all chose the same config; else none."""
    here = sizes(cell)
    sized = {s: sizes(s) for s in tuned}
    corners = []
    for sides in itertools.product((-1, 1), repeat=len(here)):
        side_of = dict(zip(here, sides, strict=True))
        inside = [s for s, at in sized.items() if all((at[d] - v) * side_of[d] >= 0 for d, v in here.items())]
        if not inside:
            return []
        corners.append(nearest(cell, inside))
    return corners if len({tuned[c].config for c in corners}) == 1 else []


def nearest(cell: Key, shapes: Sequence[Key]) -> Key:
    """The shape closest to ``cell`` (summed distance in log2 of each dimension; ties by value order)."""
    here = sizes(cell)

    def distance(shape: Key) -> float:
        return sum(abs(math.log2(v) - math.log2(here[d])) for d, v in sizes(shape).items())

    return min(shapes, key=lambda s: (distance(s), value_order(s)))


def _range_ends(
    task: str,
    points: Mapping[str, list[int]],
    policies: Mapping[str, str],
    ranges: Mapping[str, tuple[int, int]],
) -> list[Hole]:
    """The parts of each declared range its bucket policy maps to no tuned value."""
    holes = []
    for dim, (lo, hi) in sorted(ranges.items()):
        if dim not in points or dim not in policies:
            continue
        policy, pts = policies[dim], points[dim]
        bucket = make_bucketer(policy, pts)
        if bucket(lo) is None and lo < pts[0]:
            holes.append(
                Hole(task, None, f"{dim} {lo}-{pts[0] - 1}", f"below the smallest tuned {dim} ({policy})")
            )
        if bucket(hi) is None and hi > pts[-1]:
            holes.append(
                Hole(task, None, f"{dim} {pts[-1] + 1}-{hi}", f"above the largest tuned {dim} ({policy})")
            )
    return holes
