"""Why two runs of one spec choose different winners, and what the finals of the shipped rule hold,
replayed on the recorded looks.

Reads eight recorded H200 runs of the shipped decode spec (``configs/h200/flash_decode.toml``, 28
points, halving: two screening rungs, then the finals), three machines of 2026-12-04, from the
archives committed under ``benchmarks/results`` (A: ``throughput_h200_2026-12-04b``, cold, warm,
warm profiled; B: ``..._04c``, cold, warm, warm again; C: ``..._04``, cold and warm, the engine of
that day's first session). Three questions:

- **disagreement**: for each ordered pair of runs (a, b) and each point where their winners differ,
  was a's winner within 1 % in b's finals, in b's finals but behind there, or cut by b's screening
  (and how far behind the rung's fastest it read where it was cut)?
- **looks off**: each screening look of a config that reached the finals, against its finals reading
  in the same run: how often more than 5 % off, and how often the drift guard flagged it;
- **finals apart**: for two configs in the finals of one point in two runs of one machine, how far
  the ratio of their times moved from one run to the other, by batch and by the faster one's time,
  beside the width of the finals' own 95 % intervals (what a second process reads that the first's
  interval does not cover);
- **floor**: each run's winner scored by another run's finals at that point (where both timed it): the
  pick / oracle a tuner that is right in its own process scores when another process judges it, the
  floor under a held-out check made in a process of its own;
- **replay**: the finals each run held (its records, the old rule) against the finals the shipped rule
  (``tunectl.decide.search.best_looks`` and ``finals_arms``) chooses from the same looks: how often
  each holds the point's consensus winner (the config most of the eight runs chose; a tie goes to
  the run listed first), and how many arms each times.

    python benchmarks/studies/screening_replay.py [--out benchmarks/results/screening_replay.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import tarfile
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.studies.holdout_json import figures
from tunectl.core.keys import Key, key_from_text, key_text
from tunectl.core.record import Phase, Record
from tunectl.core.spec import SearchSpec, Strategy
from tunectl.decide.holdout import Standing
from tunectl.decide.points import Measured
from tunectl.decide.search import best_looks, finals_arms
from tunectl.decide.select import select_winners
from tunectl.store.results import read_results

RESULTS = Path(__file__).resolve().parents[1] / "results"
#: run name -> (archive, results directory inside it); the name's first letter is its machine
RUNS = {
    "A-cold": ("throughput_h200_2026-12-04b.tar.gz", "tp/res-after-cold"),
    "A-warm": ("throughput_h200_2026-12-04b.tar.gz", "tp/res-after-warm"),
    "A-profiled": ("throughput_h200_2026-12-04b.tar.gz", "tp/res-after-profile"),
    "B-cold": ("throughput_h200_2026-12-04c.tar.gz", "tp/res-after-cold"),
    "B-warm": ("throughput_h200_2026-12-04c.tar.gz", "tp/res-after-warm"),
    "B-warm-again": ("throughput_h200_2026-12-04c.tar.gz", "tp/res-after-warm2"),
    "C-cold": ("throughput_h200_2026-12-04.tar.gz", "tp/res-after-cold"),
    "C-warm": ("throughput_h200_2026-12-04.tar.gz", "tp/res-after-warm"),
}
#: the decode spec's [search]: halving, the other settings default
SEARCH = SearchSpec(strategy=Strategy.HALVING)
Point = tuple[str, str]  # (static key text, shape key text)


@dataclass
class Run:
    """One run's records, as the questions need them."""

    winners: dict[Point, str] = field(default_factory=dict)
    rungs: dict[Point, dict[int, Measured]] = field(default_factory=lambda: defaultdict(dict))
    finals: dict[Point, dict[str, Record]] = field(default_factory=lambda: defaultdict(dict))
    defaults: dict[Point, str] = field(default_factory=dict)


def load(results: Path) -> Run:
    records = list(read_results(results))
    run = Run(
        winners={(key_text(w.static), key_text(w.shape)): key_text(w.config) for w in select_winners(records)}
    )
    for r in records:
        point = (r.static_key, r.shape_key)
        if r.is_default:
            run.defaults[point] = r.config_key
        if r.phase is Phase.SCREEN and r.rung is not None:
            run.rungs[point].setdefault(r.rung, {})[key_from_text(r.config_key)] = r
        elif r.phase is Phase.FINAL and r.ok and r.median_us:
            run.finals[point][r.config_key] = r
    return run


def disagreement(runs: dict[str, Run]) -> dict[str, Any]:
    """Per ordered pair with different winners: where a's winner went in b (module doc)."""
    why: Counter[str] = Counter()
    behind: list[float] = []
    for a, b in itertools.permutations(runs, 2):
        for point, won in runs[a].winners.items():
            other = runs[b].winners.get(point)
            if other is None or other == won:
                continue
            finals = runs[b].finals.get(point, {})
            if won in finals and _median(finals[won]) <= _median(finals[other]) * 1.01:
                why["within 1 % in b's finals"] += 1
            elif won in finals:
                why["in b's finals, more than 1 % behind"] += 1
            else:
                why["cut by b's screening"] += 1
                rungs = runs[b].rungs[point]
                cut = max(r for r, m in rungs.items() if key_from_text(won) in m)
                looks = [_median(x) for x in rungs[cut].values() if x.ok and x.median_us]
                behind.append(_median(rungs[cut][key_from_text(won)]) / min(looks))
    bands = Counter("under 2 %" if g < 1.02 else "2-5 %" if g < 1.05 else "over 5 %" for g in behind)
    return {"pairs": dict(why), "cut_reading_behind_the_fastest": dict(bands)}


def looks_off(runs: dict[str, Run], limit: float = 0.05) -> dict[str, Any]:
    """Screening looks of finalists against their finals reading (module doc)."""
    out: dict[str, Any] = {}
    for rung in (0, 1):
        n = off = flagged = 0
        for run in runs.values():
            for point, finals in run.finals.items():
                for config, look in run.rungs[point].get(rung, {}).items():
                    final = finals.get(key_text(config))
                    if final is None or not look.ok or not look.median_us:
                        continue
                    n += 1
                    if abs(look.median_us / _median(final) - 1.0) > limit:
                        off, flagged = off + 1, flagged + bool(look.drift)
        out[f"rung {rung}"] = {"looks": n, "over 5 % off": off, "flagged": flagged}
    return out


def finals_apart(runs: dict[str, Run]) -> dict[str, Any]:
    """Two finalists' time ratio at a point, run against run of one machine (module doc)."""
    moved: dict[str, list[float]] = defaultdict(list)
    widths: list[float] = []
    for a, b in itertools.combinations(runs, 2):
        if a[0] != b[0]:
            continue
        for point in runs[a].finals.keys() & runs[b].finals.keys():
            fa, fb = runs[a].finals[point], runs[b].finals[point]
            band = _band(point)
            for one, two in itertools.combinations(sorted(fa.keys() & fb.keys()), 2):
                ra = _median(fa[one]) / _median(fa[two])
                rb = _median(fb[one]) / _median(fb[two])
                moved[band].append(abs(math.log(ra / rb)))
                moved[_time_band(min(_median(fa[one]), _median(fa[two])))].append(abs(math.log(ra / rb)))
            widths += [w for r in (*fa.values(), *fb.values()) if (w := _ci_width(r)) is not None]
    out: dict[str, Any] = {
        band: {"pairs": len(v), "median": round(statistics.median(v), 4), "p90": round(_p90(v), 4)}
        for band, v in sorted(moved.items())
    }
    out["finals_interval_width_median"] = round(statistics.median(widths), 4) if widths else None
    return out


def floor(runs: dict[str, Run]) -> dict[str, Any]:
    """Each run's winner over another run's fastest, both from that other run's finals (module doc)."""
    out: dict[str, Any] = {}
    for label, same in (("same machine", True), ("other machines", False)):
        scores: dict[str, list[float]] = defaultdict(list)
        for a, b in itertools.permutations(runs, 2):
            if (a[0] == b[0]) != same:
                continue
            for point, won in runs[a].winners.items():
                finals = runs[b].finals.get(point, {})
                if won in finals:
                    fastest = min(_median(r) for r in finals.values())
                    scores[_band(point)].append(_median(finals[won]) / fastest)
        scores["all"] = [x for v in list(scores.values()) for x in v]
        out[label] = {band: figures(Standing(band, tuple(v))) for band, v in sorted(scores.items())}
    return out


def _band(point: Point) -> str:
    batch = int(json.loads(point[1])["batch"])
    return "batch 1-8" if batch <= 8 else "batch 9-64" if batch <= 64 else "batch 65-256"


def _time_band(us: float) -> str:
    """The faster arm's time, in bands: a ratio's move between processes shrinks as calls get longer."""
    edges = ((20, "under 20 µs"), (50, "20-50 µs"), (200, "50-200 µs"), (1000, "200 µs-1 ms"))
    return next((name for edge, name in edges if us < edge), "over 1 ms")


def _median(r: Record) -> float:
    """The median of a record kept as measured (a final with one, a screening look read where ok)."""
    assert r.median_us is not None
    return r.median_us


def _ci_width(r: Record) -> float | None:
    """A final's speedup interval, its width over the speedup (None: a default arm, or none recorded)."""
    if r.speedup and r.speedup_lo and r.speedup_hi and not r.is_default:
        return (r.speedup_hi - r.speedup_lo) / r.speedup
    return None


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[8] if len(values) > 1 else values[0]


def replay(runs: dict[str, Run]) -> dict[str, Any]:
    """The finals each run held against the shipped rule's, on the same looks (module doc)."""
    points = set.intersection(*(set(r.winners) for r in runs.values()))
    consensus = {p: Counter(r.winners[p] for r in runs.values()).most_common(1)[0][0] for p in points}
    held: dict[str, list[bool]] = {"recorded": [], "shipped rule": []}
    arms: dict[str, list[int]] = {"recorded": [], "shipped rule": []}
    for run in runs.values():
        for point in points:
            rungs = run.rungs[point]
            default = run.defaults.get(point)
            if not rungs or default is None:
                continue
            shipped = finals_arms(
                best_looks([rungs[r] for r in sorted(rungs)]), key_from_text(default), SEARCH, _any
            )
            for name, finals in (
                ("recorded", set(run.finals[point])),
                ("shipped rule", set(map(key_text, shipped))),
            ):
                held[name].append(consensus[point] in finals)
                arms[name].append(len(finals))
    return {
        name: {
            "points": len(held[name]),
            "consensus_winner_in_finals": sum(held[name]),
            "share": round(sum(held[name]) / len(held[name]), 4),
            "arms_mean": round(statistics.mean(arms[name]), 2),
        }
        for name in held
    }


def _any(config: Key) -> bool:
    return True  # every config of the decode spec at these points is selectable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for archive in sorted({a for a, _ in RUNS.values()}):
            with tarfile.open(RESULTS / archive) as tar:
                tar.extractall(Path(tmp) / archive, filter="data")
        runs = {name: load(Path(tmp) / archive / inside) for name, (archive, inside) in RUNS.items()}
    figures = {
        "runs": list(RUNS),
        **{f.__name__: f(runs) for f in (disagreement, looks_off, finals_apart, floor, replay)},
    }
    print(json.dumps(figures, indent=1))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
