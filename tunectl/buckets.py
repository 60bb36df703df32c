"""Bucketing policies for shape dimensions. Standard library only (the runtime uses it).

Tuning measures a dimension at declared points; at lookup a value is mapped to one of them:

- ``exact``: the value itself, if it was tuned;
- ``floor``: the largest point <= value; ``ceil``: the smallest point >= value;
- ``nearest``: the closest point (a tie goes to the larger);
- ``pow2``: the next power of two >= value, if it was tuned.

A value outside what a policy can map returns None: a miss, never a guess.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

POLICIES = ("exact", "floor", "ceil", "nearest", "pow2")

Bucketer = Callable[[int], "int | None"]


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def make_bucketer(policy: str, points: Sequence[int]) -> Bucketer:
    """A function mapping a value to its tuned point under ``policy``, or None on a miss."""
    pts = sorted(set(points))
    members = frozenset(pts)
    if policy == "exact":
        return lambda v: v if v in members else None
    if policy == "pow2":

        def pow2(v: int) -> int | None:
            up = 1 << (v - 1).bit_length() if v > 0 else 0
            return up if up in members else None

        return pow2
    if policy == "floor":

        def floor(v: int) -> int | None:
            i = bisect.bisect_right(pts, v)
            return pts[i - 1] if i else None

        return floor
    if policy == "ceil":

        def ceil(v: int) -> int | None:
            i = bisect.bisect_left(pts, v)
            return pts[i] if i < len(pts) else None

        return ceil
    if policy == "nearest":

        def nearest(v: int) -> int | None:
            i = bisect.bisect_left(pts, v)
            if i == 0:
                return pts[0]
            if i == len(pts):
                return pts[-1]
            lo, hi = pts[i - 1], pts[i]
            return lo if v - lo < hi - v else hi

        return nearest
    raise ValueError(f"unknown bucket policy {policy!r}; expected one of {', '.join(POLICIES)}")
