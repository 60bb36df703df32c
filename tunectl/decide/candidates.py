"""Candidates: a short ranked list of configs per cell, for a serving process to confirm at its own shapes.

A cell's entry is one config chosen at its tuned point (and over its probes), but it serves a
region: between tuned points the fastest config changes (a split-KV kernel's best split count
follows the batch). On the H200's decode grids the three fastest configs at each tuned point
bracketing a held-out shape held one within 3 % of the best at every held-out shape
(``benchmarks/results/shortlist.md``); one config per cell did so at two shapes in three.

The sites of a cell are the places its region was measured: its tuned point (for a filled cell,
the point that serves it), the tuned points at the corners of the box around its region (per
dimension, its value and the tuned value beyond it on each side the region reaches: below for
``ceil`` and ``pow2``, above for ``floor``, both for ``nearest``), each probe whose shape buckets
to it, and the probes of the cells beside it (the next probed cell below and above along each
dimension): near a region's edges the config that takes over is often the one its neighbour's probes
found. At each site a config's loss is its time over the fastest config's there (a config not
measured at a site counts the site's worst loss). The list starts with the entry's config and adds,
one at a time, the config that most lowers the geometric mean over the sites of the best member's
loss. Once no config lowers it (every site's fastest is in), the list fills up to ``k`` with the
configs nearest the fastest over the sites (the geometric mean of their own losses), as long as that
is within ``FILL_WITHIN``: between the sites the fastest config changes, and a config close behind at
every site is the one most likely to take over there. At the held-out shapes of the H200's decode
runs (seeds 101-112, 89 shapes a page), filling and ``k`` = 4 (from 3, unfilled) raised the shapes whose
list held a config within 3 % of the fastest from 82 to 85 (page 16) and from 86 to 87 (page 128), for
3.8-3.9 configs a list instead of 2.6-2.7; the neighbours' probes then raised them to 87 and 89
(``benchmarks/results/holdout.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from tunectl.core.buckets import Bucketer
from tunectl.core.keys import Key, make_key, value_order
from tunectl.core.record import Phase, Record
from tunectl.decide.coverage import sizes
from tunectl.decide.probes import cell_of
from tunectl.decide.rules import Timings, probe_losses
from tunectl.decide.select import Winner, latest_comparisons

DEFAULT_CANDIDATES = 4
#: how far behind the fastest (geometric mean over the sites) a config may be and still fill a list
FILL_WITHIN = 1.10
Losses = Mapping[Key, float]  # config -> its time over the fastest config's at one site
_SIDES = {"ceil": (-1,), "pow2": (-1,), "floor": (1,), "nearest": (-1, 1), "exact": ()}


def shortlist(first: Key, sites: Sequence[Losses], k: int) -> tuple[Key, ...]:
    """``first`` and up to ``k - 1`` configs added greedily, those that cover the sites first, then
    those nearest the fastest (module doc); () for ``k`` 0."""
    if k <= 0:
        return ()
    chosen = [first]
    pool = sorted({c for site in sites for c in site} - {first}, key=value_order)
    near = {c for c in pool if _score([c], sites) <= math.log(FILL_WITHIN)}
    while len(chosen) < k:
        score = _score(chosen, sites)
        covering = [c for c in pool if _score([*chosen, c], sites) < score]
        eligible = covering or [c for c in pool if c in near]
        if not eligible:
            break
        best = min(eligible, key=lambda c: (_score([*chosen, c], sites), _score([c], sites), pool.index(c)))
        chosen.append(best)
        pool.remove(best)
    return tuple(chosen)


def _score(members: Sequence[Key], sites: Sequence[Losses]) -> float:
    """The geometric mean over ``sites`` of the best member's loss (0.0 without sites)."""
    if not sites:
        return 0.0
    logs = [math.log(min(site.get(m, max(site.values())) for m in members)) for site in sites]
    return sum(logs) / len(logs)


def corners(cell: Key, tuned: Sequence[Key], policies: Mapping[str, str]) -> list[Key]:
    """The tuned shapes among the corners of the box around ``cell``'s region (module doc)."""
    values = {name: sorted({sizes(s)[name] for s in tuned}) for name, _ in cell}
    keys: list[dict[str, int]] = [{}]
    for name, value in sizes(cell).items():
        grid = values[name]
        side = [value]
        for way in _SIDES.get(policies.get(name, "exact"), ()):
            beyond = [v for v in grid if (v - value) * way > 0]
            side += [(max if way < 0 else min)(beyond)] if beyond else []
        keys = [{**k, name: v} for k in keys for v in side]
    found = set(tuned)
    return [shape for shape in map(make_key, keys) if shape in found]


def probe_sites(
    probes: Sequence[Record], cell_of: Callable[[str, Key], Key | None]
) -> dict[tuple[str, Key, Key], list[Losses]]:
    """Each probe's losses, by the (task, static, cell) its shape buckets to."""
    out: dict[tuple[str, Key, Key], list[Losses]] = {}
    for arms in latest_comparisons(probes, Phase.PROBE).values():
        first, losses = arms[0], probe_losses(arms)
        cell = cell_of(first.task, first.shape)
        if cell is not None and losses:
            out.setdefault((first.task, first.static, cell), []).append(losses)
    return out


def candidate_lists(
    winners: Sequence[Winner],
    timings: Timings,
    probes: Sequence[Record],
    bucketers: Mapping[str, Mapping[str, Bucketer]],
    policies: Mapping[str, Mapping[str, str]],
    k: int = DEFAULT_CANDIDATES,
) -> dict[tuple[str, Key, Key], tuple[Key, ...]]:
    """Per (task, static, cell) of ``winners``: its ranked candidates (module doc)."""
    if k <= 0:
        return {}
    at_probes = probe_sites(probes, lambda task, shape: cell_of(shape, bucketers.get(task, {})))
    tuned: dict[tuple[str, Key], list[Key]] = {}
    for task, static, shape in timings:
        tuned.setdefault((task, static), []).append(shape)
    probed: dict[tuple[str, Key], list[Key]] = {}
    for task, static, cell in at_probes:
        probed.setdefault((task, static), []).append(cell)
    out = {}
    for w in winners:
        shapes = tuned.get((w.task, w.static), [])
        points = corners(w.shape, shapes, policies.get(w.task, {})) if shapes else []
        if w.served_by is not None:
            points = [w.served_by, *points]
        sites: list[Losses] = [_losses(timings.get((w.task, w.static, p), {})) for p in dict.fromkeys(points)]
        for cell in [w.shape, *beside(w.shape, probed.get((w.task, w.static), []))]:
            sites += at_probes.get((w.task, w.static, cell), [])
        out[(w.task, w.static, w.shape)] = shortlist(w.config, [s for s in sites if s], k)
    return out


def beside(cell: Key, cells: Sequence[Key]) -> list[Key]:
    """The cells of ``cells`` next to ``cell``: along each dimension, the nearest one below and above
    it whose other dimensions are the cell's."""
    here = sizes(cell)
    out = []
    for name, value in here.items():
        line = sorted({sizes(c)[name] for c in cells if {**sizes(c), name: value} == here})
        nearest = [v for v in line if v < value][-1:] + [v for v in line if v > value][:1]
        out += [make_key({**here, name: v}) for v in nearest]
    return out


def _losses(times: Mapping[Key, float]) -> dict[Key, float]:
    positive = {c: t for c, t in times.items() if t > 0}
    fastest = min(positive.values(), default=0.0)
    return {c: t / fastest for c, t in positive.items()} if fastest else {}
