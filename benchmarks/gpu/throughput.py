"""Two measuring engines side by side on one GPU: what a run cost, where a worker's time went, and
whether the two chose the same winners.

``figures`` reads one results directory (one run) into its figures; ``compare`` sets the runs of two
engines (``before``, ``after``) side by side, cold and warm caches, into ``throughput.json``'s form.
The runs themselves come from ``benchmarks/gpu/throughput_h200.sh`` on the GPU host.

    python benchmarks/gpu/throughput.py compare --runs /tmp/tp --out benchmarks/results/throughput.json
    python benchmarks/gpu/throughput.py agreement /tmp/tp/res-after-warm /tmp/tp/res-after-cold ...
    python benchmarks/gpu/throughput.py figures /tmp/accurate/res-warm   # one run's figures (this engine)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

#: warm-up samples a row's sampler took before its samples: the old engine warmed every measurement
#: (the spec's 3); the new one warms a fresh graph sampler once and a reused one not at all, so 0 is
#: counted for it (its kernel time is not overstated)
WARMUP = {"before": 3, "after": 0}


def figures(results: Path, warmup: int) -> dict[str, Any]:
    """A run's wall span, GPU busy share, screening item cost and the guard's share of measuring."""
    from benchmarks.costs.fleet import run_figures
    from tunectl.report.worker_time import worker_times
    from tunectl.store.results import read_results

    run = run_figures(results, warmup)
    records = read_results(results)
    rows = [r.to_row() for r in records]
    screens = screen_item_seconds(rows)
    parts = run["worker_time_s"]
    return {
        "span_s": run["span_s"],
        "records": run["records"],
        "gpu_busy": round(statistics.fmean(run["busy_fraction"].values()), 4),
        "screen_item_ms": round(1e3 * statistics.median(screens), 1) if screens else None,
        "guard_share": round(parts["of which guard"] / parts["measuring"], 4) if parts["measuring"] else None,
        "worker_time_s": parts,
        "statuses": run["statuses"],
        "worker_startup": worker_startup(results),
        "between_calls_s": round(sum(w.waiting_s for w in worker_times(records)), 2),
        "guard_of_remeasured_rows_s": guard_of_remeasured(rows),
        "calls_by_phase_s": calls_by_phase_s(rows),
    }


def guard_of_remeasured(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The guard's seconds in the rows it made again, and in all rows, and how many it made again."""
    again = [r for r in rows if (r["remeasured"] or 0) > 0]
    return {
        "rows": len(again),
        "seconds": round(sum(r["guard_ms"] or 0.0 for r in again) / 1e3, 2),
        "of_all_s": round(sum(r["guard_ms"] or 0.0 for r in rows) / 1e3, 2),
    }


def calls_by_phase_s(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds of the workers' calls, by the phase of their rows (screening, finals, probes, ...): a
    call's rows share its start, and the call lasts until its last row's finish."""
    calls: dict[tuple[Any, Any], list[Any]] = {}
    for r in rows:
        if r["worker"]:
            call = calls.setdefault((r["worker"], r["started_at"]), [r["phase"], r["finished_at"]])
            call[1] = max(call[1], r["finished_at"])
    out: dict[str, float] = {}
    for (_, start), (phase, end) in calls.items():
        out[phase] = out.get(phase, 0.0) + _seconds(end - start)
    return {phase: round(s, 1) for phase, s in out.items()}


def worker_startup(results: Path) -> list[str]:
    """Each worker's start-up as its ready line in the run's log says it (process, imports, device,
    libraries); empty for runs whose workers did not say."""
    found = []
    for log in sorted((results / "_runs").glob("*.log")):
        found += re.findall(r"worker (\S+) ready: .*?; start-up (.*)$", log.read_text(), flags=re.M)
    return [f"{name}: {text}" for name, text in found]


def screen_item_seconds(rows: list[dict[str, Any]]) -> list[float]:
    """Each screening look's share of its call: a batch's rows share their start (the call's), so a
    call's span over its rows is what each cost; a single look's span is its own."""
    calls: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for r in rows:
        if r["phase"] == "screen":
            calls.setdefault((r["worker"], r["started_at"]), []).append(r)
    per_look = []
    for mine in calls.values():
        span = _seconds(max(r["finished_at"] for r in mine) - mine[0]["started_at"])
        per_look += [span / len(mine)] * len(mine)
    return per_look


def returns(rows: list[dict[str, Any]]) -> dict[int, int]:
    """How far each worker went before it came back to a point: for every return to a point it had
    left, how many other points it measured in between (the calls in order; a call's rows share its
    start). A worker that keeps its last k points built reuses them on the returns under k."""
    calls: dict[tuple[Any, Any], Any] = {}
    for r in rows:
        if r["worker"]:
            calls.setdefault((r["worker"], r["started_at"]), (r["static_key"], r["shape_key"]))
    out: dict[int, int] = {}
    for worker in {w for w, _ in calls}:
        points = [p for (w, _), p in sorted(calls.items(), key=lambda c: c[0][1]) if w == worker]
        last: dict[Any, int] = {}
        for i, point in enumerate(points):
            if point in last and points[i - 1] != point:
                between = len(set(points[last[point] + 1 : i]))
                out[between] = out.get(between, 0) + 1
            last[point] = i
    return dict(sorted(out.items()))


def _seconds(value: Any) -> float:
    return value.total_seconds() if hasattr(value, "total_seconds") else float(value)


def winners(results: Path) -> dict[tuple[str, str], tuple[str, dict[str, float]]]:
    """Per point (static, shape): the winner's config and every config's single-timing median."""
    from tunectl.core.keys import key_text
    from tunectl.decide.select import select_winners
    from tunectl.store.results import read_results

    records = list(read_results(results))
    medians: dict[tuple[str, str], dict[str, float]] = {}
    for r in records:
        if r.ok and r.median_us and r.phase in ("measure", "screen", "final"):
            medians.setdefault((r.static_key, r.shape_key), {})[r.config_key] = r.median_us
    out = {}
    for w in select_winners(records):
        point = (key_text(w.static), key_text(w.shape))
        out[point] = (key_text(w.config), medians.get(point, {}))
    return out


def same_decisions(before: Path, after: Path, within: float = 0.01) -> dict[str, Any]:
    """Points where the two engines chose the same config, or configs within ``within`` of each other
    by the before run's own times at that point."""
    old, new = winners(before), winners(after)
    points = sorted(set(old) & set(new))
    same = 0
    for p in points:
        (a, times), (b, _) = old[p], new[p]
        if a == b or (a in times and b in times and times[b] <= times[a] * (1 + within)):
            same += 1
    return {
        "points": len(points),
        "same_or_within": same,
        "share": round(same / len(points), 4) if points else None,
    }


def cmd_compare(args: argparse.Namespace) -> None:
    runs = Path(args.runs)
    out: dict[str, Any] = {"runs": {}}
    for caches in ("cold", "warm"):
        for engine in ("before", "after"):
            results = runs / f"res-{engine}-{caches}"
            if (results).exists():
                warmup = args.before_warmup if engine == "before" else WARMUP[engine]
                fig = figures(results, warmup)
                wall = runs / f"wall-{engine}-{caches}.txt"
                fig["wall_s"] = float(wall.read_text()) if wall.exists() else None
                out["runs"][f"{engine}-{caches}"] = fig
    for name, figure in (
        ("decode_grid_s", "wall_s"),
        ("gpu_busy", "gpu_busy"),
        ("screen_item_ms", "screen_item_ms"),
        ("drift_guard_share", "guard_share"),
    ):
        out[name] = {
            engine: {
                c: out["runs"][f"{engine}-{c}"][figure]
                for c in ("cold", "warm")
                if f"{engine}-{c}" in out["runs"]
            }
            for engine in ("before", "after")
        }
    for caches in ("cold", "warm"):
        b, a = runs / f"res-before-{caches}", runs / f"res-after-{caches}"
        if b.exists() and a.exists():
            out[f"same_winner_{caches}"] = same_decisions(b, a)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1, default=str))


def agreement(results: list[Path]) -> dict[str, Any]:
    """``same_decisions`` between every pair of ``results`` (runs of one spec): how often two runs agree
    on a winner, the floor any before/after comparison of decisions stands on."""
    pairs = {
        f"{a} vs {b}": same_decisions(a, b)["share"] for i, a in enumerate(results) for b in results[i + 1 :]
    }
    shares = [v for v in pairs.values() if v is not None]
    summary = {"median": statistics.median(shares), "min": min(shares), "max": max(shares)} if shares else {}
    return {"pairs": pairs, **summary}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--runs", required=True, help="the folder throughput_h200.sh wrote (res-ENGINE-CACHES)")
    c.add_argument("--out", required=True)
    c.add_argument(
        "--before-warmup",
        type=int,
        default=WARMUP["before"],
        help="warm-up samples the before engine took a measurement (3: the engine of 45ad4e3; 0: one that "
        "warms a fresh sampler once, as this one)",
    )
    a = sub.add_parser("agreement", help="how often runs of one spec agree on winners, pair by pair")
    a.add_argument("results", nargs="+", type=Path, help="two or more results folders of one spec")
    f = sub.add_parser("figures", help="one run's figures per results folder (this engine's runs)")
    f.add_argument("results", nargs="+", type=Path)
    r = sub.add_parser("returns", help="returns to a point, by how many other points came in between")
    r.add_argument("results", nargs="+", type=Path)
    args = p.parse_args()
    if args.cmd == "returns":
        from tunectl.store.results import read_results

        found = {str(d): returns([x.to_row() for x in read_results(d)]) for d in args.results}
        print(json.dumps(found, indent=1))
        return
    if args.cmd == "figures":
        print(json.dumps({str(r): figures(r, WARMUP["after"]) for r in args.results}, indent=1, default=str))
        return
    if args.cmd == "agreement":
        print(json.dumps(agreement(args.results), indent=1, default=str))
        return
    cmd_compare(args)


if __name__ == "__main__":
    main()
