"""A cell confirmed at its edges, in parts: each part's pick read off the lines between the edges.

Confirming by cell (``tunectl.measure.confirm``) times a cell's candidates at its edges along the
dimensions a serving process leaves out. The cell is then cut in ``PARTS`` along each of them
(``tunectl.core.buckets.split_cells``: evenly on a log scale), and each part's pick is the candidate
fastest at the part's middle, each candidate's time there read on the straight line between its
times at the two edges (the plane between four corners where two dimensions are left out): a decode
kernel's time grows with the length it reads. At the H200 held-out shapes of seeds 101-118 that the
tuning runs' comparisons bracket (94 shapes), the line changed 6 of the choices made on the
geometric mean of the two ends (the rule before it), each for the better (by 2-7 %), none for the
worse; between the tuning runs' own compared lengths it read as the mean did
(``benchmarks/studies/cell_transfer.py --ends 4 --holdout ...``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tunectl.core.buckets import cell_edges, cell_middle, cell_range, parts_of, split_cells

#: the parts a cell timed at its edges is cut in along each dimension left out, each with its own pick
PARTS = 4
#: a part of a cell: its shape (its middle along the dimensions left out), and its least and greatest
#: value along each of them
Part = tuple[Mapping[str, Any], Mapping[str, Any], tuple[tuple[str, int, int], ...]]
#: a part of a cell before it is timed: its shape, each of the cell's readings' weight at its middle,
#: and its ranges (``cell_parts``)
Weighed = tuple[dict[str, Any], tuple[float, ...], tuple[tuple[str, int, int], ...]]


@dataclass(frozen=True)
class Along:
    """A cell along one dimension left out: its middle, its edges, and its parts (module doc): each
    one's middle, where that lies between the edges (0 at the first, 1 at the second), its least
    and greatest value."""

    middle: int
    edges: tuple[int, ...]
    parts: tuple[tuple[int, float, int, int], ...]

    @classmethod
    def of(cls, policy: str, points: Sequence[int], point: int) -> Along:
        finer = split_cells(policy, points, PARTS)
        parts = tuple(
            (cell_middle(policy, finer, part), where, *cell_range(policy, finer, part))
            for part, where in parts_of(policy, points, finer, point)
        )
        return cls(cell_middle(policy, points, point), cell_edges(policy, points, point), parts)

    def weight(self, where: float, edge: int) -> float:
        """The weight of the reading at ``edge`` at a part's middle ``where`` between the edges."""
        if len(self.edges) < 2:
            return 1.0
        return where if edge == self.edges[1] else 1.0 - where


def cell_parts(
    given: Mapping[str, Any], dims: Sequence[str], combo: Sequence[Along], corners: Sequence[tuple[int, ...]]
) -> tuple[Weighed, ...]:
    """A cell's parts (a cell of ``tunectl.measure.confirm``): every combination of its parts along
    each dimension, each one's shape, each reading's weight at its middle (the product of the weights
    along each: the line between two edges, a plane between four), and its ranges."""
    out: list[Weighed] = []
    for pieces in itertools.product(*(a.parts for a in combo)):
        shape = {**given, **{d: piece[0] for d, piece in zip(dims, pieces, strict=True)}}
        weights = tuple(
            math.prod(a.weight(piece[1], edge) for a, piece, edge in zip(combo, pieces, corner, strict=True))
            for corner in corners
        )
        out.append(
            (shape, weights, tuple((d, piece[2], piece[3]) for d, piece in zip(dims, pieces, strict=True)))
        )
    return tuple(out)


def on_lines(
    read: Sequence[tuple[Mapping[str, Any], list[float] | None]], weights: Sequence[float]
) -> list[tuple[Mapping[str, Any], float | None]]:
    """Each config's time at a part's middle: its readings at the cell's points (None: one failed),
    each weighed as ``cell_parts`` says."""
    return [
        (c, None if t is None else math.fsum(w * x for w, x in zip(weights, t, strict=True))) for c, t in read
    ]


def holds(ranges: Sequence[tuple[str, int, int]], shape: Mapping[str, Any]) -> bool:
    return all(low <= shape[d] <= high for d, low, high in ranges)


def told_by_part(parts: Sequence[Part]) -> str:
    """Each pick with the part it serves, parts side by side with one pick told as one (along one
    dimension: its values from the first's least to the last's greatest)."""
    runs: list[tuple[Mapping[str, Any], list[tuple[tuple[str, int, int], ...]]]] = []
    for _, config, ranges in parts:
        if runs and runs[-1][0] == config and len(ranges) == 1:
            runs[-1][1].append(ranges)
        else:
            runs.append((config, [ranges]))
    told = []
    for config, spans in runs:
        where = ", ".join(
            f"{d} {low}-{spans[-1][i][2]}" if low != spans[-1][i][2] else f"{d}={low}"
            for i, (d, low, _) in enumerate(spans[0])
        )
        told.append(f"{dict(config)} at {where}")
    return "; ".join(told)
