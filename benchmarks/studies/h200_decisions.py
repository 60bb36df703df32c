"""Do the decisions hold? Reproducibility of winners, search cost, stacked validation — from results.

    python benchmarks/studies/h200_decisions.py --results RESULTS > benchmarks/results/h200_decisions.md

Reads every run in RESULTS (made by ``benchmarks/gpu/h200_session.sh``): grid runs of the same spec are
paired in start order for reproducibility; the first grid run of each spec is the ground truth for
the search strategies' runs of that spec; validation runs are tabulated as ``tunectl validate``
prints them.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.studies import search_cost
from tunectl.core.keys import key_text
from tunectl.core.spec import parse_spec
from tunectl.decide.select import Winner
from tunectl.decide.stacked import read_validation
from tunectl.formats.export import winners_in
from tunectl.store.results import read_results
from tunectl.store.runs import RunInfo, list_runs

TIE = 0.02


def _spec(info: RunInfo) -> Any:
    return parse_spec(info.spec_text, info.spec_path, info.name, stored=True)


def _strategy(info: RunInfo) -> str:
    """The strategy the run was made with, as its spec names it (a retired one included)."""
    return str(tomllib.loads(info.spec_text).get("search", {}).get("strategy", "grid"))


def _rows(results: str, run_id: str) -> list[dict[str, Any]]:
    return [r.to_row() for r in read_results(results, run_ids=[run_id])]


def _medians(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], float]:
    return {
        (r["static_key"], r["shape_key"], r["config_key"]): r["median_us"]
        for r in rows
        if r["phase"] == "measure" and r["status"] == "ok"
    }


def _close(w: Winner, other: Winner, medians: Mapping[tuple[str, str, str], float]) -> bool:
    """``other``'s config within the tie tolerance of ``w``'s in the run ``medians`` come from."""
    at = (key_text(w.static), key_text(w.shape))
    mine, theirs = medians.get((*at, key_text(w.config))), medians.get((*at, key_text(other.config)))
    return mine is not None and theirs is not None and theirs <= mine * (1 + TIE)


def reproducibility(results: str, a: RunInfo, b: RunInfo) -> str:
    wa = {(w.static, w.shape): w for w in winners_in(results, run_ids=[a.run_id])}
    wb = {(w.static, w.shape): w for w in winners_in(results, run_ids=[b.run_id])}
    ma, mb = _medians(_rows(results, a.run_id)), _medians(_rows(results, b.run_id))
    same = tie = 0
    differ = []
    for key in sorted(wa.keys() & wb.keys(), key=repr):
        x, y = wa[key], wb[key]
        if x.config == y.config:
            same += 1
        elif _close(x, y, ma) or _close(y, x, mb):
            tie += 1
        else:
            differ.append(f"  - {key_text(x.shape)}: {key_text(x.config)} vs {key_text(y.config)}")
    n = len(wa.keys() & wb.keys())
    lines = [
        f"| {a.name} | {a.run_id} / {b.run_id} | {n} | {same} | {tie} | {len(differ)} | "
        f"{(same + tie) / n:.0%} |"
    ]
    return "\n".join(lines + (["", "Differ:", *differ, ""] if differ else []))


def validation_table(results: str, info: RunInfo) -> str:
    v = read_validation(read_results(results, run_ids=[info.run_id]))
    out = [
        f"{info.name} ({info.run_id}): {v.layers} layers per stack, {v.rounds} interleaved rounds; "
        "times per layer, net of the thrash kernels\n",
        "| shape | static | bundle config | default µs | bundle µs | speedup [95 % CI] | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in v.points:
        s = f"{p.speedup.estimate:.3f}x [{p.speedup.lo:.3f}, {p.speedup.hi:.3f}]" if p.speedup else p.status
        static = {k: val for k, val in p.static if k in ("page_size", "mask", "num_docs", "window")}
        out.append(
            f"| {key_text(p.shape)} | {static} | {key_text(p.config)} | "
            f"{p.default_us or 0:,.1f} | {p.bundle_us or 0:,.1f} | {s} | {p.verdict} |"
        )
    g = v.geomean
    if g is not None:
        out.append(
            f"\ngeometric mean over {len(v.points)} shapes: {g.estimate:.3f}x, "
            f"95 % CI [{g.lo:.3f}, {g.hi:.3f}]"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True)
    args = ap.parse_args()
    runs = sorted(list_runs(args.results), key=lambda r: r.created_at)
    tune = [r for r in runs if r.kind == "tune"]
    grids: dict[str, list[RunInfo]] = {}
    for r in tune:
        if _strategy(r) == "grid":
            grids.setdefault(r.name, []).append(r)
    print("## Reproducibility: the same spec run twice\n")
    print(
        f"Winners equal, or within the tie tolerance ({TIE:.0%}: one's median within {TIE:.0%} of the "
        "other's in either run's full measurements).\n"
    )
    print("| spec | runs | keys | same config | within tie | differ | agree |\n|---|---|---|---|---|---|---|")
    for pair in grids.values():
        if len(pair) >= 2:
            print(reproducibility(args.results, pair[0], pair[1]))
    print("\n## Search cost against the exhaustive grid (real runs)\n")
    for name, pair in grids.items():
        truth = search_cost._truth(_rows(args.results, pair[0].run_id))
        spec = _spec(pair[0])
        print(f"{name}: ground truth run {pair[0].run_id}, {len(truth)} points\n")
        print(search_cost.HEADER)
        for r in tune:
            other = _spec(r)
            if r.name != name or _strategy(r) == "grid":
                continue
            rows = _rows(args.results, r.run_id)
            label = f"{_strategy(r)} ({r.run_id}, {r.state})"
            print(search_cost.from_run(spec, truth, rows, label, other).line())
        print()
    print("## Stacked validation of the published bundles against the defaults\n")
    for r in runs:
        if r.kind == "validate" and r.state == "finished":
            print(validation_table(args.results, r))
            print()


if __name__ == "__main__":
    main()
