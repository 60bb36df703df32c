"""How to serve a grid cell that has no result of its own: leave-one-out over recorded tuning runs.

Each tuned point of a run is left out in turn and chosen for from the other points, as export fills
a cell nobody measured, by:

- ``nearest``: the winner of the nearest tuned point (log2 distance; what export did until 2026-12-02);
- ``lines``: export's rule (``coverage.source_for``): a segment whose two ends agree, else the nearest
  point on a line through the cell, else the nearest of all;
- ``interp``: the winners of the points that bracket it along each dimension (the others fixed) are
  candidates; each one's time there is estimated from its own times at those points (linear in log
  time against log size between a dimension's two sides; one side's time where only one has it),
  dimensions weighted by 1 / span^2 (``interp-flat``: equal weights); a candidate replaces the
  nearest point's winner only where it is estimated faster by more than the margin.

A choice scores its config's measured median at the point over the fastest config's there (1.0: the
best). Medians are the run's own single timings (a config's full measurement, else its look at the
highest halving rung). A choice whose config
did not run at the point counts as failed.

    git show 45ad4e3:benchmarks/results/h200_results.tar.gz > /tmp/h200_results.tar.gz
    tar xzf /tmp/h200_results.tar.gz -C /tmp
    PYTHONPATH=. python benchmarks/studies/fill_study.py --results /tmp/res2 --run r20261201-040719-64e593 ...

``--bundle-out DIR`` instead exports each run as a bundle whose unmeasured cells are filled by
``interp`` (``DIR/interp-RUN/1``; export's own code, its filling replaced here only), for
``benchmarks/studies/holdout_table.py`` to score at held-out shapes beside the bundle export made. With
``--fill hedge`` (``DIR/hedge-RUN/1``) every cell, measured or not, serves the config whose worst
loss over the tuned corners of the region the cell serves (with ``ceil``: the cell's values and the
grid values below them) is least, where that beats the cell's own choice by more than the margin.
``--fill enclosing``: each filled cell from the nearest tuned point at or above it in every dimension;
``--fill nearest``: from the nearest tuned point of all (export's rule until 2026-12-02).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.studies.h200_archive import require
from tunectl.core.keys import Key
from tunectl.core.record import Phase, Record, latest
from tunectl.core.shapes import line_brackets
from tunectl.decide.coverage import nearest, sizes, source_for
from tunectl.decide.select import Winner
from tunectl.formats.export import facts_of, margin_of, select_from
from tunectl.store.results import read_results

Times = Mapping[Key, Mapping[Key, float]]  # shape -> config -> median µs


def estimate(cell: Key, config: Key, pairs: Sequence[tuple[Key | None, Key | None]], times: Times,
             weighted: bool) -> float | None:  # fmt: skip
    logs, weights = [], []
    here = sizes(cell)
    for lo, hi in pairs:
        t_lo = times.get(lo, {}).get(config) if lo is not None else None
        t_hi = times.get(hi, {}).get(config) if hi is not None else None
        if lo is not None and hi is not None and t_lo and t_hi:
            (dim,) = [d for d, v in sizes(lo).items() if v != sizes(hi)[d]]
            x, x0, x1 = math.log2(here[dim]), math.log2(sizes(lo)[dim]), math.log2(sizes(hi)[dim])
            logs.append(math.log(t_lo) + (math.log(t_hi) - math.log(t_lo)) * (x - x0) / (x1 - x0))
            weights.append(1.0 / (x1 - x0) ** 2)
        elif t_lo or t_hi:
            side = lo if t_lo else hi
            assert side is not None
            span = max(abs(math.log2(here[d]) - math.log2(v)) for d, v in sizes(side).items())
            logs.append(math.log(t_lo or t_hi))  # type: ignore[arg-type]
            weights.append(1.0 / (2 * span) ** 2)
    if not logs:
        return None
    if not weighted:
        weights = [1.0] * len(logs)
    return math.exp(sum(w * g for w, g in zip(weights, logs, strict=True)) / sum(weights))


def by_interpolation(weighted: bool) -> Callable[[Key, Mapping[Key, Winner], Times, float], Key]:
    def choose(cell: Key, tuned: Mapping[Key, Winner], times: Times, margin: float) -> Key:
        mine = tuned[nearest(cell, list(tuned))].config
        pairs = line_brackets(cell, tuned)
        candidates = {tuned[s].config for pair in pairs for s in pair if s is not None} | {mine}
        guesses = {c: estimate(cell, c, pairs, times, weighted) for c in candidates}
        if guesses.get(mine) is None:
            return mine
        config, best = min(((c, t) for c, t in guesses.items() if t is not None), key=lambda ct: ct[1])
        return config if best * (1.0 + margin) < guesses[mine] else mine  # type: ignore[operator]

    return choose


def by_nearest(cell: Key, tuned: Mapping[Key, Winner], times: Times, margin: float) -> Key:
    return tuned[nearest(cell, list(tuned))].config


def by_lines(cell: Key, tuned: Mapping[Key, Winner], times: Times, margin: float) -> Key:
    return tuned[source_for(cell, tuned)].config


METHODS = {
    "nearest": by_nearest,
    "lines": by_lines,
    "interp": by_interpolation(True),
    "interp-flat": by_interpolation(False),
}


def run_data(results: Path, run: str) -> tuple[list[Winner], dict[Key, dict[Key, dict[Key, float]]], float]:
    """``run``'s winners, each config's single-timing median per (static, shape), and its margin."""
    records = read_results(results, run_ids=[run])
    facts = facts_of(results, [run])
    winners = select_from(
        [r for r in records if r.phase in (Phase.MEASURE, Phase.SCREEN, Phase.FINAL)], facts
    )
    single = [r for r in records if r.phase in (Phase.MEASURE, Phase.SCREEN) and r.ok and r.median_us]
    rank = lambda r: (r.phase is Phase.MEASURE, r.rung or 0, r.num_samples or 0)  # noqa: E731
    last: dict[tuple[Key, Key, Key], Record] = latest(single, lambda r: (r.static, r.shape, r.config), rank)
    times: dict[Key, dict[Key, dict[Key, float]]] = {}
    for (static, shape, config), r in last.items():
        times.setdefault(static, {}).setdefault(shape, {})[config] = float(r.median_us)  # type: ignore[arg-type]
    return winners, times, margin_of(facts)


def hedge(cell: Key, cells: Sequence[Key], times: Times, margin: float, own: Key, winners: set[Key]) -> Key:
    """The config, of the tuned points' ``winners``, least bad at the worst tuned corner of the region
    ``cell`` serves (module doc)."""
    values: dict[str, set[int]] = {}
    for c in cells:
        for dim, v in sizes(c).items():
            values.setdefault(dim, set()).add(v)
    sides = [[(dim, v), *[(dim, max(b)) for b in [[x for x in values[dim] if x < v]] if b]]
             for dim, v in sizes(cell).items()]  # fmt: skip
    measured = {frozenset(sizes(s).items()): s for s in times}
    corners = [measured[k] for k in map(frozenset, itertools.product(*sides)) if k in measured]
    configs = set.intersection(winners, *(set(times[c]) for c in corners)) if corners else set()
    loss = {x: max(times[c][x] / min(times[c].values()) for c in corners) for x in configs}
    best = min(loss, key=loss.__getitem__, default=own)
    return best if loss.get(best, math.inf) * (1.0 + margin) < loss.get(own, math.inf) else own


def enclosing(cell: Key, shapes: Sequence[Key]) -> Key:
    """The nearest of the tuned shapes at or above ``cell`` in every dimension (what served its region
    under ``ceil`` before refinement split it), else the nearest of all."""
    here = sizes(cell)
    above = [s for s in shapes if all(v >= here[d] for d, v in sizes(s).items())]
    return nearest(cell, above or shapes)


def refilled_bundle(results: Path, run: str, out: Path, fill: str) -> None:
    """Export ``run`` as export does, its cells chosen by ``fill`` (``interp``: the filled ones only)."""
    from tunectl.formats import export

    _, times, margin = run_data(results, run)
    real_cover = export.cover

    def cover(selected: Sequence[Winner], **kwargs: object) -> object:
        coverage = real_cover(selected, **kwargs)  # type: ignore[arg-type]
        out_winners = []
        for w in coverage.winners:
            tuned = {t.shape: t for t in selected if t.task == w.task and t.static == w.static}
            if fill == "hedge":
                cells = [c.shape for c in coverage.winners if (c.task, c.static) == (w.task, w.static)]
                configs = {t.config for t in tuned.values()}
                config = hedge(w.shape, cells, times.get(w.static, {}), margin, w.config, configs)
            elif w.served_by is not None and fill == "enclosing":
                config = tuned[enclosing(w.shape, list(tuned))].config
            elif w.served_by is not None and fill == "nearest":
                config = tuned[nearest(w.shape, list(tuned))].config
            elif w.served_by is not None:
                config = METHODS["interp"](w.shape, tuned, times.get(w.static, {}), margin)
            else:
                config = w.config
            if config != w.config:
                source = next(t for t in tuned.values() if t.config == config)
                w = dataclasses.replace(
                    source, shape=w.shape, served_by=source.shape, served_why=w.served_why
                )
            out_winners.append(w)
        return dataclasses.replace(coverage, winners=tuple(out_winners))

    export.cover = cover  # type: ignore[assignment]
    try:
        scope = export.Scope(run_ids=(run,))
        done = export.export_bundle(results, f"{fill}-{run}", "1", out=out, scope=scope)
    finally:
        export.cover = real_cover
    print(f"{run}: {done.location}")


def study(results: Path, run: str) -> dict[str, list[float]]:
    """Per method, the score of each left-out point of ``run`` (inf: its choice did not run there)."""
    winners, all_times, margin = run_data(results, run)
    scores: dict[str, list[float]] = {m: [] for m in METHODS}
    for static in {w.static for w in winners}:
        tuned = {w.shape: w for w in winners if w.static == static}
        times = {shape: t for shape, t in all_times.get(static, {}).items() if shape in tuned}
        for cell in tuned:
            others = {s: w for s, w in tuned.items() if s != cell}
            if not others or cell not in times:
                continue
            best = min(times[cell].values())
            for name, choose in METHODS.items():
                pick = choose(cell, others, {s: t for s, t in times.items() if s != cell}, margin)
                scores[name].append(times[cell].get(pick, math.inf) / best)
    return scores


def summary(scores: Sequence[float], margin: float = 0.02) -> str:
    ok = sorted(s for s in scores if math.isfinite(s))
    failed = len(scores) - len(ok)
    if not ok:
        return "no points"
    p95 = ok[min(len(ok) - 1, math.ceil(0.95 * len(ok)) - 1)]
    geo = math.exp(sum(map(math.log, ok)) / len(ok))
    lost = sum(s > 1 + margin for s in ok)
    return (f"{len(scores)} | {statistics.median(ok):.3f} | {p95:.3f} | {ok[-1]:.3f} | {geo:.3f} | "
            f"{lost} | {failed}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", required=True, type=Path)
    parser.add_argument("--run", action="append", required=True, help="a tuning run (repeat)")
    parser.add_argument("--bundle-out", type=Path, help="export refilled bundles here instead")
    parser.add_argument(
        "--fill",
        choices=("interp", "hedge", "enclosing", "nearest"),
        default="interp",
        help="with --bundle-out",
    )
    args = parser.parse_args()
    require(args.results)
    if args.bundle_out:
        for run in args.run:
            refilled_bundle(args.results, run, args.bundle_out, args.fill)
        return 0
    print("| run | method | points | median | p95 | worst | geomean | lose > 2 % | did not run |")
    print("|---|---|---|---|---|---|---|---|---|")
    pooled: dict[str, list[float]] = {m: [] for m in METHODS}
    for run in args.run:
        for name, scores in study(args.results, run).items():
            pooled[name] += scores
            print(f"| {run} | {name} | {summary(scores)} |")
    for name, scores in pooled.items():
        print(f"| all | {name} | {summary(scores)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
