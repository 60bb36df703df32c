"""What a search strategy costs, and what it finds, against the exhaustive grid.

The exhaustive run (strategy ``grid``) is the ground truth: every config's median at every point.

- ``replay``: drives each strategy with the exhaustive run's medians as the device's answers (a
  failed config fails again). Exact and free, but a replayed cheap look is as good as a full one,
  which flatters successive halving: use it to compare settings, not to claim numbers.
- ``runs``: reads real runs of the strategies on the same spec and device (made with
  ``[search] strategy = ...``) and compares each run's winners with the grid.

Cost is measurement work in units of one full measurement of one config (a screening look at budget
0.1 costs 0.1), over the grid's (one per config and point); the finals, which every strategy ends
with, are counted apart. A point is *found* when the winner's time in the exhaustive run is within
1 % of the best time there (``grid best / its time >= 0.99``).

    python benchmarks/studies/search_cost.py replay --results RESULTS --run GRID_RUN
    python benchmarks/studies/search_cost.py runs --results RESULTS --run GRID_RUN \
        --other HALVING_RUN --other ...
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import statistics
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tunectl.core.keys import key_text
from tunectl.core.plan import RunFacts, WorkItem, plan
from tunectl.core.record import RECORD_FIELDS, Record
from tunectl.core.spec import Spec, parse_spec
from tunectl.decide.search import Search
from tunectl.decide.select import select_winners
from tunectl.store.results import read_results
from tunectl.store.runs import load_run

Point = tuple[str, str]


@dataclasses.dataclass
class Outcome:
    name: str
    cost: float  # full-measurement units spent before the finals
    grid_cost: int
    finals: int  # configs timed in finals (default included)
    quality: list[float]  # per point: grid best / the pick's time in the grid

    def line(self) -> str:
        found = sum(q >= 0.99 for q in self.quality)
        return (
            f"| {self.name} | {self.cost:.1f} / {self.grid_cost} = {self.cost / self.grid_cost:.0%} | "
            f"{self.finals} | {found} / {len(self.quality)} | {_geo(self.quality):.4f} | "
            f"{min(self.quality):.3f} |"
        )


HEADER = (
    "| strategy | measurement cost (full measurements) vs grid | configs in finals | points within 1 % "
    "of the grid's best | geomean quality | worst |\n|---|---|---|---|---|---|"
)


def _geo(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def _truth(rows: Sequence[Mapping[str, Any]]) -> dict[Point, dict[str, Mapping[str, Any]]]:
    truth: dict[Point, dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        if r["phase"] == "measure":
            truth.setdefault((r["static_key"], r["shape_key"]), {})[r["config_key"]] = r
    return truth


def _may_win(spec: Spec, static: Any, config: Any) -> bool:
    """Whether the task lets ``config`` win at ``static`` (as the run's plan-time facts say)."""
    return _facts(spec).selectable(static, config)


@functools.cache
def _facts(spec: Spec) -> RunFacts:
    return plan(spec).facts


def _grid_cost(spec: Spec, truth: Mapping[Point, Mapping[str, Mapping[str, Any]]]) -> int:
    """Configs that may win at their point (the grid also measures some for reference only)."""
    from tunectl.core.keys import key_from_text

    return sum(
        _may_win(spec, key_from_text(p[0]), key_from_text(c)) or r["is_default"]
        for p, configs in truth.items()
        for c, r in configs.items()
    )


def _grid_best(spec: Spec, truth: Mapping[Point, Mapping[str, Mapping[str, Any]]], point: Point) -> float:
    from tunectl.core.keys import key_from_text

    static = key_from_text(point[0])
    ok = [
        r["median_us"]
        for c, r in truth[point].items()
        if r["status"] == "ok" and _may_win(spec, static, key_from_text(c))
    ]
    return min(ok)


def replay(spec: Spec, truth: Mapping[Point, Mapping[str, Mapping[str, Any]]], name: str) -> Outcome:
    search = Search(plan(spec), spec.search)

    def answer(item: WorkItem) -> list[Record]:
        point = (key_text(item.static), key_text(item.shape))
        configs = item.arms or (item.config,)
        base = truth[point][key_text(configs[0])]
        out = []
        for rid, config in zip(item.record_ids(), configs, strict=True):
            r = truth[point][key_text(config)]
            row = {**r, "item_id": rid, "phase": item.phase}
            if item.arms and r["status"] == "ok" and base["status"] == "ok":
                s = base["median_us"] / r["median_us"]
                row.update(
                    speedup=s,
                    speedup_lo=s,
                    speedup_hi=s,
                    group_id=item.item_id,
                    is_default=config == configs[0],
                )
            out.append(Record(**{name: row[name] for name in RECORD_FIELDS}))
        return out

    queue, cost, finals, rows = search.draw(sys.maxsize), 0.0, 0, []  # every point up front
    while queue:
        item = queue.pop(0)
        records = answer(item)
        rows += [dataclasses.asdict(r) for r in records]
        if item.arms:
            finals += len(item.arms)
        else:
            cost += item.budget
        queue += search.follow_up(records)
    return Outcome(name, cost, _grid_cost(spec, truth), finals, _quality(spec, truth, rows))


def _quality(
    spec: Spec, truth: Mapping[Point, Mapping[str, Mapping[str, Any]]], rows: Sequence[Mapping[str, Any]]
) -> list[float]:
    quality = []
    records = [Record.from_row({**r, "device_name": "d", "task": spec.task}) for r in rows]
    for w in select_winners(records, selectable=lambda task, static, config: _may_win(spec, static, config)):
        point = (key_text(w.static), key_text(w.shape))
        pick = truth[point][key_text(w.config)]
        quality.append(_grid_best(spec, truth, point) / pick["median_us"])
    return quality


def from_run(
    spec: Spec,
    truth: Mapping[Point, Mapping[str, Mapping[str, Any]]],
    rows: Sequence[Mapping[str, Any]],
    name: str,
    run_spec: Spec,
) -> Outcome:
    """A strategy's run (made with ``run_spec``) against the grid run ``truth`` of ``spec``."""
    cost = sum(_look_cost(run_spec, r) for r in rows if r["phase"] in ("screen", "measure"))
    finals = sum(r["phase"] == "final" for r in rows)
    return Outcome(name, cost, _grid_cost(spec, truth), finals, _quality(spec, truth, rows))


def _look_cost(run_spec: Spec, row: Mapping[str, Any]) -> float:
    """A full measurement costs 1; a screening look its rung's share (the budget its item ran with)."""
    if row["phase"] == "measure":
        return 1.0
    return run_spec.search.rung_budget(row["rung"] or 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("replay", "runs"))
    ap.add_argument("--results", required=True)
    ap.add_argument("--run", required=True, help="the exhaustive (grid) run")
    ap.add_argument("--other", action="append", default=[], help="runs mode: a strategy's run")
    args = ap.parse_args()
    info = load_run(args.results, args.run)
    base = parse_spec(info.spec_text, info.spec_path, info.name)
    truth = _truth([r.to_row() for r in read_results(args.results, run_ids=[args.run])])
    print(f"{info.name} ({args.run}): {len(truth)} points, {sum(len(v) for v in truth.values())} configs\n")
    print(HEADER)
    if args.mode == "replay":
        variants: list[tuple[str, dict[str, Any]]] = [
            ("grid", {"strategy": "grid"}),
            ("halving eta=3 min_budget=0.1", {"strategy": "halving"}),
        ]
        variants += [
            ("halving eta=4 min_budget=1/16", {"strategy": "halving", "eta": 4, "min_budget": 1 / 16})
        ]
        for name, settings in variants:
            spec = dataclasses.replace(base, search=dataclasses.replace(base.search, **settings))
            print(replay(spec, truth, name).line())
        return
    for run_id in args.other:
        other = load_run(args.results, run_id)
        spec = parse_spec(other.spec_text, other.spec_path, other.name, stored=True)
        rows = [r.to_row() for r in read_results(args.results, run_ids=[run_id])]
        strategy = tomllib.loads(other.spec_text).get("search", {}).get("strategy", "grid")
        print(from_run(base, truth, rows, f"{strategy} ({run_id})", spec).line())


if __name__ == "__main__":
    main()
