"""Which configs must a point between tuned points try? Scored at held-out shapes, from recorded runs.

For each shape of a holdout run (``tunectl validate --holdout``: every selectable config timed there
in one interleaved comparison), the candidates are the ``k`` fastest configs at tuned points of a
tuning run around it, ranked by each config's single-timing median there (its full measurement,
else its look at the highest halving rung, as ``fill_study.run_data`` reads them):

- ``ceil``: the point whose cell serves the shape under ``ceil`` (what export's lookup uses);
- ``around``: the tuned points bracketing it in every dimension (up to 4 in two dimensions).

The score is the best candidate's time at the shape over the fastest config's there (1.0: the
shortlist held the best config). It says how short a list a point between tuned points may measure
and still find what serving should run there; ``k = 1`` with ``ceil`` is the fastest config of the
serving cell's point, before finals and the margin rule.

``--coarse batch=1,4,16 kv_len=1024,8192`` plays refinement with a short list on a run that measured
every config everywhere: the points on those values keep every config, each other point keeps only
the ``k`` fastest of the coarse points around it, and chooses its fastest among them; each held-out
shape is served by its ``ceil`` cell's choice. It prints what that serves against every config kept,
with the configs each way measures (one look per config and point, counted before halving's rungs
and the finals).

``--bundle DIR`` scores a bundle's own lists instead (``Bundle.candidates``: what export's
``--candidates`` wrote, the pick first) beside its pick alone, per holdout run and pooled, and what
confirming the list would install if it timed each candidate as the holdout run did
(``tunectl.measure.confirm.installed``, with its margin): the list's best less what the margin costs.

    git show 45ad4e3:benchmarks/results/h200_results.tar.gz > /tmp/h200_results.tar.gz
    tar xzf /tmp/h200_results.tar.gz -C /tmp
    PYTHONPATH=. python benchmarks/studies/shortlist_study.py --results /tmp/res2 \
        --tuning r20261202-132019-a416c3 --holdout r20261202-133935-e6f40f
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.studies.fill_study import enclosing, run_data
from benchmarks.studies.h200_archive import require
from tunectl.core.keys import Key, make_key
from tunectl.core.record import Phase, Record
from tunectl.core.spec import DEFAULT_MARGIN
from tunectl.decide.coverage import sizes
from tunectl.decide.select import latest_comparisons
from tunectl.measure.confirm import installed
from tunectl.runtime import Bundle, load_bundle
from tunectl.store.results import read_results


def bracket(value: int, grid: Sequence[int]) -> list[int]:
    """The grid values just below and just above ``value`` (one where it is a value or outside)."""
    i = bisect.bisect_left(grid, value)
    return sorted({grid[max(0, i - 1)], grid[min(i, len(grid) - 1)]})


def ceil_of(value: int, grid: Sequence[int]) -> int:
    return next((g for g in grid if g >= value), grid[-1])


def around(shape: Key, tuned: Sequence[Key], how: str) -> list[Key]:
    """The tuned shapes that ``how`` (``ceil`` or ``around``) takes candidates from. Where the grid
    point ``ceil`` names was not tuned (a run that refined part of its grid, or skipped a point),
    the nearest tuned point at or above the shape in every dimension stands in for it."""
    here = sizes(shape)
    values = {dim: sorted({sizes(s)[dim] for s in tuned}) for dim in here}
    if how == "ceil":
        point = make_key({**dict(shape), **{d: ceil_of(v, values[d]) for d, v in here.items()}})
        return [point if point in tuned or not tuned else enclosing(shape, tuned)]
    keys = [dict(shape)]
    for dim, v in here.items():
        keys = [{**k, dim: b} for k in keys for b in bracket(v, values[dim])]
    return [make_key(k) for k in keys]


def shortlist(times: Mapping[Key, Mapping[Key, float]], shape: Key, k: int, how: str) -> set[Key]:
    """The ``k`` fastest configs at each tuned point ``how`` takes candidates from for ``shape``."""
    found: set[Key] = set()
    for point in around(shape, list(times), how):
        there = times.get(point, {})
        found |= set(sorted(there, key=there.__getitem__)[:k])
    return found


def score(arms: Sequence[Record], candidates: set[Key]) -> float | None:
    """The best candidate's time over the fastest config's, from one held-out comparison."""
    ok = {r.config: (1.0 if r.is_default else r.speedup or 0.0) for r in arms if r.ok}
    found = [ok[c] for c in candidates if ok.get(c)]
    return max(ok.values()) / max(found) if found else None


def coarse_play(
    times: Mapping[Key, Mapping[Key, float]], coarse: Mapping[str, set[int]], k: int
) -> tuple[dict[Key, Key], int]:
    """Each point's choice when only the points on ``coarse`` values measured every config (module doc),
    and how many configs were measured over all points."""
    on_grid = [p for p in times if all(sizes(p)[d] in vs for d, vs in coarse.items())]
    chosen: dict[Key, Key] = {}
    measured = 0
    for point, there in times.items():
        kept = set(there)
        if point not in on_grid:
            kept &= shortlist({p: times[p] for p in on_grid}, point, k, "around")
        measured += len(kept)
        chosen[point] = min(kept, key=there.__getitem__)
    return chosen, measured


def summary(got: Sequence[float]) -> str:
    return (f"{statistics.median(got):.3f} | {max(got):.3f} | {statistics.geometric_mean(got):.3f} "
            f"| {sum(s <= 1.03 for s in got)} of {len(got)}")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--tuning", required=True, help="the tuning run (one static key)")
    parser.add_argument("--holdout", action="append", required=True, help="a holdout run (repeat)")
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--bundle", type=Path, help="score this bundle's candidates (Bundle.candidates)")
    parser.add_argument("--coarse", nargs="+", metavar="DIM=V,V", help="play refinement from these values")
    args = parser.parse_args(argv)
    require(args.results)
    _, by_static, _ = run_data(args.results, args.tuning)
    held_by_run = {}
    for run in args.holdout:
        records = [r for r in read_results(args.results, [run]) if r.phase == Phase.HOLDOUT]
        held_by_run[run] = list(latest_comparisons(records, Phase.HOLDOUT).values())
    if args.bundle:
        bundle_scores(load_bundle(args.bundle), held_by_run)
        return
    if args.coarse:
        coarse = {d: {int(v) for v in vs.split(",")} for d, _, vs in (c.partition("=") for c in args.coarse)}
        print("| holdout run | points keep | configs measured | median | worst | geomean | within 3 % |")
        print("|---|---|---|---|---|---|---|")
        for run, held in held_by_run.items():
            for k in [*args.k, 0]:
                made = [coarse_play(times, coarse if k else {}, k) for times in by_static.values()]
                chosen = {point: c for choice, _ in made for point, c in choice.items()}
                got = [s for arms in held
                       for cell in around(arms[0].shape, list(by_static.get(arms[0].static, {})), "ceil")
                       if cell in chosen and (s := score(arms, {chosen[cell]})) is not None]  # fmt: skip
                keep = f"the coarse points' {k} fastest" if k else "every config"
                print(f"| {run} | {keep} | {sum(m for _, m in made)} | {summary(got)} |")
        return
    scored = per_run_table(held_by_run, by_static, args.k)
    print("\nPooled over the holdout runs:\n")
    print("| candidates | k | shapes | configs in the list (mean) | median | worst | geomean | within 3 % |")
    print("|---|---|---|---|---|---|---|---|")
    for (how, k), (got, tried) in scored.items():
        print(f"| {how} | {k} | {len(got)} | {statistics.mean(tried):.1f} | {summary(got)} |")


def bundle_scores(bundle: Bundle, held_by_run: Mapping[str, list[list[Record]]]) -> None:
    """Print, per holdout run and pooled, the best of the bundle's candidates at each held-out shape
    over the fastest config there, the same for its pick alone and for what confirming installs; then
    the shapes whose list lacks a config within 3 % of the fastest."""
    print(
        "| holdout run | list | shapes | configs in the list (mean) | median | worst | geomean | within 3 % |"
    )
    print("|---|---|---|---|---|---|---|---|")
    ways = ("pick", "candidates", "confirmed")
    pooled: dict[str, tuple[list[float], list[int]]] = {w: ([], []) for w in ways}
    for run, held in [*held_by_run.items(), ("pooled", [])]:
        for which, (all_got, all_len) in pooled.items():
            got, lengths = (all_got, all_len) if run == "pooled" else ([], [])
            for arms in held:
                params = {**dict(arms[0].static), **dict(arms[0].shape)}
                listed = bundle.candidates(arms[0].task, **params)[: 1 if which == "pick" else None]
                chosen = [confirmed(arms, listed)] if which == "confirmed" and listed else listed
                if (s := score(arms, {make_key(c) for c in chosen})) is not None:
                    got.append(s)
                    lengths.append(len(listed))
            if run != "pooled":
                all_got.extend(got)
                all_len.extend(lengths)
            if got:
                print(f"| {run} | {which} | {len(got)} | {statistics.mean(lengths):.1f} | {summary(got)} |")
    for run, held in held_by_run.items():
        lacking(bundle, run, held)


def lacking(bundle: Bundle, run: str, held: Sequence[Sequence[Record]]) -> None:
    """Print each held-out shape of ``run`` whose list holds no config within 3 % of the fastest there."""
    for arms in held:
        listed = bundle.candidates(arms[0].task, **dict(arms[0].static), **dict(arms[0].shape))
        got = score(arms, {make_key(c) for c in listed})
        if got is not None and got > 1.03:
            ok = [r for r in arms if r.ok]
            fastest = max(ok, key=lambda r: 1.0 if r.is_default else r.speedup or 0.0)
            shape, config = dict(arms[0].shape), dict(fastest.config)
            print(f"{run} {shape}: the list's best {got:.3f}, the fastest {config}")


def confirmed(arms: Sequence[Record], listed: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """What confirming ``listed`` installs at one held-out shape, given the holdout run's times."""
    ok = {r.config: (1.0 if r.is_default else r.speedup or 0.0) for r in arms if r.ok}
    timed = [(c, 1.0 / ok[k] if ok.get(k := make_key(c)) else None) for c in listed]
    return installed(timed, DEFAULT_MARGIN)


def per_run_table(
    held_by_run: Mapping[str, list[list[Record]]],
    by_static: Mapping[Key, Mapping[Key, Mapping[Key, float]]],
    ks: Sequence[int],
) -> dict[tuple[str, int], tuple[list[float], list[int]]]:
    """Print each holdout run's scores per way and k; return them pooled (scores, list lengths)."""
    pooled: dict[tuple[str, int], tuple[list[float], list[int]]] = {}
    print(
        "| holdout run | candidates | k | shapes | configs in the list (mean) | median | worst | geomean "
        "| within 3 % |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for run, held in held_by_run.items():
        for how in ("ceil", "around"):
            for k in ks:
                lists = [(a, shortlist(by_static.get(a[0].static, {}), a[0].shape, k, how)) for a in held]
                got = [s for arms, short in lists if (s := score(arms, short)) is not None]
                pooled.setdefault((how, k), ([], []))[0].extend(got)
                pooled[(how, k)][1].extend(len(short) for _, short in lists)
                if got:
                    tried = statistics.mean(len(short) for _, short in lists)
                    print(f"| {run} | {how} | {k} | {len(got)} | {tried:.1f} | {summary(got)} |")
    return pooled


if __name__ == "__main__":
    main()
