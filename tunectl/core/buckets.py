"""Bucketing policies for shape dimensions. Standard library only (the runtime uses it).

Tuning measures a dimension at declared points; at lookup a value is mapped to one of them:

- ``exact``: the value itself, if it was tuned;
- ``floor``: the largest point <= value; ``ceil``: the smallest point >= value;
- ``nearest``: the closest point (a tie goes to the larger);
- ``pow2``: the next power of two >= value, if it was tuned.

A value outside what a policy can map returns None: a miss, never a guess. A value equal to an
integer buckets as that integer (``4``, ``4.0``, ``numpy.int64(4)``; like any Python value, ``True``
equals 1); anything else (``4.5``, ``"4"``, None) is a miss. Equal values therefore always bucket
alike, which is what lets the runtime remember results by value. A bucketer never raises.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Callable, Sequence

POLICIES = ("exact", "floor", "ceil", "nearest", "pow2")

Bucketer = Callable[[object], "int | None"]


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def as_int(value: object) -> int | None:
    """The integer ``value`` equals, or None."""
    if type(value) is int:
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def make_bucketer(policy: str, points: Sequence[int]) -> Bucketer:
    """A function mapping a value to its tuned point under ``policy``, or None on a miss."""
    pts = sorted(set(points))
    if any(type(p) is not int for p in pts):
        raise ValueError(f"bucket points must be integers, not {pts!r}")
    if policy not in POLICIES:
        raise ValueError(f"unknown bucket policy {policy!r}; expected one of {', '.join(POLICIES)}")
    if not pts:
        return lambda v: None
    return _MAKERS[policy](pts)


def cell_middle(policy: str, points: Sequence[int], point: int) -> int:
    """A value inside ``point``'s cell under ``policy`` (the values that bucket to it), at the cell's
    geometric middle where tuned points bound it on both sides (shapes spread on a log scale), else
    the point itself: the place to time a cell by one value, as confirming at start-up does."""
    edges = cell_edges(policy, points, point)
    if len(edges) < 2:  # exact, nearest (its cell is around the point), an open-ended end cell
        return point
    low, high = cell_range(policy, points, point)
    return min(high, max(low, round(math.sqrt(edges[0] * edges[1]))))


def cell_range(policy: str, points: Sequence[int], point: int) -> tuple[int, int]:
    """The least and the greatest value of ``point``'s cell under ``policy`` where tuned points bound
    it on both sides (``cell_edges``); ``(point, point)`` where the cell is the point or open-ended."""
    edges = cell_edges(policy, points, point)
    if len(edges) < 2:
        return point, point
    return (edges[0] + 1, edges[1]) if policy in ("ceil", "pow2") else (edges[0], edges[1] - 1)


def cell_edges(policy: str, points: Sequence[int], point: int) -> tuple[int, ...]:
    """The values bounding ``point``'s cell under ``policy``: the tuned points on either side of it
    (the one beyond a ``ceil`` cell's lower end, or a ``floor`` cell's upper end, is just outside it),
    or the point alone where the cell is open-ended or is the point (``exact``, ``nearest``)."""
    pts = sorted(set(points))
    i = pts.index(point)
    if policy == "ceil" and i > 0:
        return pts[i - 1], point
    if policy == "floor" and i + 1 < len(pts):
        return point, pts[i + 1]
    if policy == "pow2" and point > 1:
        return point // 2, point
    return (point,)


def refined(policy: str, points: Sequence[int], factor: float = 2.0) -> list[int]:
    """``points`` with points put between any two more than ``factor`` apart (evenly on a log scale),
    under a ``floor`` or ``ceil`` policy, so that no cell between tuned points spans more than
    ``factor``; other policies' cells are the points' own, returned as they are."""
    pts = sorted(set(points))
    if policy not in ("floor", "ceil"):
        return pts
    out = pts[:1]
    for low, high in itertools.pairwise(pts):
        steps = math.ceil(math.log(high / low) / math.log(factor) - 1e-9)
        out += [round(low * (high / low) ** (i / steps)) for i in range(1, steps)] + [high]
    return sorted(set(out))


def split_cells(policy: str, points: Sequence[int], parts: int) -> list[int]:
    """``points`` with each cell between two of them cut in ``parts`` (evenly on a log scale, as far
    as integers allow) under a ``floor`` or ``ceil`` policy; other policies' cells are the points'
    own, returned as they are. Every point of ``points`` stays one: each new cell lies in one old."""
    pts = sorted(set(points))
    if policy not in ("floor", "ceil"):
        return pts
    out = set(pts)
    for low, high in itertools.pairwise(pts):
        cuts = (round(low * (high / low) ** (i / parts)) for i in range(1, parts))
        out.update(cut for cut in cuts if low < cut < high)
    return sorted(out)


def parts_of(policy: str, points: Sequence[int], finer: Sequence[int], point: int) -> list[tuple[int, float]]:
    """The cells of ``finer`` (``points`` split: ``split_cells``) inside ``point``'s cell of ``points``
    under ``policy``: each one's point, and where its middle (``cell_middle``) lies between the
    ``points`` cell's edges (``cell_edges``), 0 at the first, 1 at the second (0 where it has one)."""
    edges, bucket, fine = cell_edges(policy, points, point), make_bucketer(policy, points), sorted(set(finer))
    out = []
    for part in fine:
        middle = cell_middle(policy, fine, part)
        if bucket(middle) == point:
            where = (middle - edges[0]) / (edges[1] - edges[0]) if len(edges) == 2 else 0.0
            out.append((part, min(1.0, max(0.0, where))))
    return out


# One maker per policy, over the sorted distinct points (never empty). Every closure starts with the
# common case, a plain int, and coerces anything else once.


def _exact(pts: list[int]) -> Bucketer:
    members = {p: p for p in pts}

    def exact(v: object) -> int | None:
        return members.get(v if type(v) is int else as_int(v))  # type: ignore[arg-type]

    return exact


def _pow2(pts: list[int]) -> Bucketer:
    members = {p: p for p in pts}

    def pow2(v: object) -> int | None:
        n = v if type(v) is int else as_int(v)
        if n is None or n < 1:
            return None
        return members.get(1 << (n - 1).bit_length())

    return pow2


def _floor(pts: list[int]) -> Bucketer:
    lo = pts[0]

    def floor(v: object) -> int | None:
        n = v if type(v) is int else as_int(v)
        if n is None or n < lo:
            return None
        return pts[bisect.bisect_right(pts, n) - 1]

    return floor


def _ceil(pts: list[int]) -> Bucketer:
    hi = pts[-1]

    def ceil(v: object) -> int | None:
        n = v if type(v) is int else as_int(v)
        if n is None or n > hi:
            return None
        return pts[bisect.bisect_left(pts, n)]

    return ceil


def _nearest(pts: list[int]) -> Bucketer:
    lo, hi = pts[0], pts[-1]

    def nearest(v: object) -> int | None:
        n = v if type(v) is int else as_int(v)
        if n is None:
            return None
        i = bisect.bisect_left(pts, n)
        if i == 0:
            return lo
        if i == len(pts):
            return hi
        below, above = pts[i - 1], pts[i]
        return below if n - below < above - n else above

    return nearest


_MAKERS: dict[str, Callable[[list[int]], Bucketer]] = {
    "exact": _exact,
    "floor": _floor,
    "ceil": _ceil,
    "nearest": _nearest,
    "pow2": _pow2,
}
