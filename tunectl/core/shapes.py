"""A spec's shape dimensions: the points tuned first, how lookup buckets, the span serving meets.

One ``[shapes.<name>]`` table of a spec (``tunectl.core.spec``) reads into a ``ShapeDim`` here::

    [shapes.kv_len]
    range = [1024, 32768]   # optional: the span serving meets, refined where winners change
    values = [1024, 4096]   # the starting grid (with a range, default: its ends, powers of two between)
    step = 512              # refined values are multiples of this
    bucket = "ceil"         # exact | floor | ceil | nearest | pow2; a range needs floor, ceil or nearest
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tunectl.core.buckets import POLICIES, is_pow2
from tunectl.core.errors import SpecError
from tunectl.core.keys import Key

#: bucket policies that map every value between two tuned points to one of them (what a range needs)
RANGE_POLICIES = ("floor", "ceil", "nearest")
_KEYS = ("values", "bucket", "range", "step")


@dataclass(frozen=True)
class ShapeDim:
    """One dynamic dimension: the points tuned first, how lookup buckets, and, for a dimension that
    declares ``range = [lo, hi]``, the span serving meets (refinement adds points inside it, at
    multiples of ``step``)."""

    name: str
    values: tuple[int, ...]
    bucket: str = "exact"
    range: tuple[int, int] | None = None
    step: int = 1


def starting_points(lo: int, hi: int) -> list[int]:
    """A range's starting grid when it gives no ``values``: its ends and the powers of two between."""
    return sorted({lo, hi, *(1 << e for e in range(hi.bit_length()) if lo < 1 << e < hi)})


def read_dim(name: str, dim: Mapping[str, Any], *, path: str) -> ShapeDim:
    """The dimension ``[shapes.<name>]`` declares; SpecError naming ``path`` and the field otherwise."""
    fld = f"shapes.{name}"
    extra = sorted(set(dim) - set(_KEYS))
    if extra:
        raise SpecError(path, f"{fld}.{extra[0]}", f"unknown key; expected {', '.join(_KEYS)}")
    span = _span(dim.get("range"), path, f"{fld}.range")
    step = dim.get("step", 1)
    if type(step) is not int or step < 1:
        raise SpecError(path, f"{fld}.step", "must be a positive integer")
    values = _values(dim.get("values", starting_points(*span) if span else None), path, f"{fld}.values")
    if span and not all(span[0] <= v <= span[1] for v in values):
        raise SpecError(path, f"{fld}.values", f"every value must lie in the range [{span[0]}, {span[1]}]")
    bucket = dim.get("bucket", "exact")
    if bucket not in POLICIES:
        raise SpecError(path, f"{fld}.bucket", f"{bucket!r} is not one of {', '.join(POLICIES)}")
    if span and bucket not in RANGE_POLICIES:
        raise SpecError(
            path,
            f"{fld}.bucket",
            f"a range needs a bucket that maps every value in it: {', '.join(RANGE_POLICIES)}",
        )
    if bucket == "pow2" and not all(is_pow2(v) for v in values):
        raise SpecError(path, f"{fld}.values", "bucket 'pow2' needs every value to be a power of two")
    return ShapeDim(name, tuple(sorted(values)), bucket, span, step)


def _values(value: object, path: str, fld: str) -> list[int]:
    if not isinstance(value, list) or not value or any(type(v) is not int or v < 1 for v in value):
        raise SpecError(path, fld, "must be a non-empty list of positive integers")
    if len(set(value)) != len(value):
        raise SpecError(path, fld, "values repeat")
    return value


def _span(value: object, path: str, fld: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2 or any(type(v) is not int or v < 1 for v in value):
        raise SpecError(path, fld, "must be [lo, hi], two positive integers")
    if value[0] >= value[1]:
        raise SpecError(path, fld, f"lo must be below hi, not [{value[0]}, {value[1]}]")
    return (value[0], value[1])


def line_brackets(
    shape: Key, shapes: Iterable[Key], dims: Iterable[str] | None = None
) -> list[tuple[Key | None, Key | None]]:
    """Of ``shapes``, the nearest below and the nearest above ``shape`` along each integer dimension
    (of ``dims``; default every one), the other values equal: a (below, above) pair per dimension
    that has either, None for a missing side."""
    here = dict(shape)
    shapes = list(shapes)
    out: list[tuple[Key | None, Key | None]] = []
    for dim in here if dims is None else dims:
        value = here.get(dim)
        if type(value) is not int:
            continue
        line: list[tuple[int, Key]] = []
        for other in shapes:
            there = dict(other)
            v = there.get(dim)
            if type(v) is int and v != value and all(there.get(n) == x for n, x in here.items() if n != dim):
                line.append((v, other))
        below = max((t for t in line if t[0] < value), key=lambda t: t[0], default=None)
        above = min((t for t in line if t[0] > value), key=lambda t: t[0], default=None)
        if below or above:
            out.append((below[1] if below else None, above[1] if above else None))
    return out


def line_neighbours(shape: Key, shapes: Iterable[Key], dims: Iterable[str] | None = None) -> list[Key]:
    """``line_brackets``' shapes in one list: dimension by dimension, below first."""
    return [s for pair in line_brackets(shape, shapes, dims) for s in pair if s is not None]
