"""Where one work item's time goes inside a worker, part by part: a spec's grid items run through the
worker's own runner (``ItemRunner``) in this process, under cProfile, and each part of the item's path
summed over the items.

A run's rows say how long loading, point set-up and measuring took (``compile_ms``, ``setup_ms``,
``measure_ms``, ``guard_ms``); this says what inside those, and what outside them, costs: the
correctness check's comparison, building the sampler (its first estimate, graph capture), the drift
guard's levels, checks and looks, the samples themselves, the device-state reads, the record.

With ``--cache`` pointing at a run's compile cache (``tunectl submit --compile-cache``) the kernels load
as a worker's would; without it they compile here, and loading dominates.

    python benchmarks/costs/item_cost.py configs/h200/flex_prefill.toml --cache /tmp/fleet-x/cache-prefill-1
    python benchmarks/costs/item_cost.py configs/quickstart.toml      # on the CPU

``--stats`` reads instead the profiles a real run's workers wrote (``TUNECTL_PROFILE=DIR tunectl
submit ...``: each worker profiles its calls and leaves ``worker-PID.pstats`` in DIR) and prints the
same parts, then the functions that took the most time of their own:

    python benchmarks/costs/item_cost.py --stats DIR
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

#: (part, module path suffix, function): cumulative time of each, over all the items. (Not the item's
#: whole call or its first kernel call: loading a kernel resets the profiler's view of the frames
#: already running, so those read zero; the items' wall times stand in for the whole.)
PARTS = (
    ("point set-up (inputs, reference)", "tunectl/measure/runner.py", "_load_point"),
    ("loading (prepare)", "tunectl/measure/runner.py", "timed_prepare"),
    ("check: the output against the reference", "tunectl/measure/runner.py", "_check"),
    ("sampler build", "tunectl/measure/timing.py", "make_sampler"),
    ("  of which first estimate (and warm-up)", "tunectl/measure/difference.py", "warm_pair_us"),
    ("  of which graph capture", "tunectl/measure/graphs.py", "graph_of"),
    ("  of which spin cover", "tunectl/measure/difference.py", "cover"),
    ("guard, whole (incl. the measurement)", "tunectl/measure/drift.py", "measure_many"),
    ("  guard levels (a point's first item; waits)", "tunectl/measure/drift.py", "_time_level"),
    ("  guard checks (before, looks, after)", "tunectl/measure/drift.py", "_check"),
    ("  guard, all its own work (levels, checks, waits)", "tunectl/measure/drift.py", "_timed"),
    ("  guard waits", "tunectl/measure/drift.py", "_came_back"),
    ("sampling (harness collect)", "tunectl/measure/harness.py", "collect"),
    ("device state reads (where not on their own thread)", "tunectl/measure/nvml.py", "read_state"),
    ("  of which NVML init", "pynvml.py", "nvmlInit"),
    ("  of which power", "pynvml.py", "nvmlDeviceGetPowerUsage"),
    ("  of which violation counters", "pynvml.py", "nvmlDeviceGetViolationStatus"),
    ("event timer (a chunk of launches, one wait)", "tunectl/measure/difference.py", "many"),
    ("records (from each config's outcome)", "tunectl/measure/records.py", "measured"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?")
    parser.add_argument("--stats", help="a folder (or file) of worker profiles from a run: summarise them")
    parser.add_argument("--cache", help="a run's compile cache root, to load kernels as its workers did")
    parser.add_argument("--device", default=None, help="cuda:0 or cpu (default: cuda:0 where there is one)")
    parser.add_argument("--limit", type=int, default=0, help="at most this many items (0: all)")
    parser.add_argument("--json", help="write the parts and the per-item rows here")
    args = parser.parse_args()
    if args.stats:
        return summarise(args.stats)
    if not args.spec:
        parser.error("a spec, or --stats")
    if args.cache:
        from tunectl.tasks.compile import cache_env

        os.environ.update(cache_env(args.cache))
    import torch

    from tunectl.core.plan import plan
    from tunectl.core.spec import load_spec
    from tunectl.measure.runner import ItemRunner

    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    spec = load_spec(args.spec)
    items = list(plan(spec).work_items())[: args.limit or None]
    runner = ItemRunner(device)
    rows: list[dict[str, Any]] = []
    profile = cProfile.Profile()
    started = time.perf_counter()
    for item in items:
        t0 = time.perf_counter()
        profile.enable()
        [record] = runner.run("item-cost", item, spec.measure)
        profile.disable()
        rows.append({
            "config": record.config_key, "shape": record.shape_key, "status": str(record.status),
            "wall_ms": (time.perf_counter() - t0) * 1e3, "median_us": record.median_us,
            "num_samples": record.num_samples, "compile_ms": record.compile_ms,
            "measure_ms": record.measure_ms, "guard_ms": record.guard_ms,
        })  # fmt: skip
    wall = time.perf_counter() - started
    parts = cumulative(pstats.Stats(profile))
    each = wall / max(len(items), 1) * 1e3
    print(f"{len(items)} items on {device}, {wall:.1f} s in all ({each:.0f} ms each)\n")
    print("| part | seconds | per item | calls |\n|---|---|---|---|")
    for name, (seconds, calls) in parts.items():
        print(f"| {name} | {seconds:.2f} | {seconds / max(len(items), 1) * 1e3:.1f} ms | {calls} |")
    ok = [r for r in rows if r["status"] == "ok"]
    if ok:
        print(f"\nstatuses: {sum(1 for _ in ok)} ok of {len(rows)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"parts": parts, "rows": rows, "wall_s": wall}, indent=1))
    return 0


def summarise(where: str, top: int = 30) -> int:
    """The parts, and the ``top`` functions by time of their own, over the worker profiles at ``where``."""
    files = sorted(Path(where).glob("*.pstats")) if Path(where).is_dir() else [Path(where)]
    if not files:
        print(f"no .pstats files at {where}")
        return 1
    stats = pstats.Stats(*(str(f) for f in files))
    total = stats.total_tt  # type: ignore[attr-defined]
    print(f"{len(files)} profile(s), {total:.1f} s inside the workers' calls\n")
    print("| part | seconds | calls |\n|---|---|---|")
    for name, (seconds, calls) in cumulative(stats).items():
        print(f"| {name} | {seconds:.2f} | {calls} |")
    print("\n| function (own time) | seconds | cumulative | calls |\n|---|---|---|---|")
    table = stats.stats  # type: ignore[attr-defined]
    ranked = sorted(table.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    for (path, line, func), (primitive, _total, own, cum, _callers) in ranked:
        where_ = f"{Path(path).name}:{line}" if line else path
        print(f"| {func} ({where_}) | {own:.2f} | {cum:.2f} | {primitive} |")
    return 0


def cumulative(stats: pstats.Stats) -> dict[str, tuple[float, int]]:
    """Each of ``PARTS``: its cumulative seconds and primitive calls (summed over same-named entries)."""
    table: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]
    out: dict[str, tuple[float, int]] = {}
    for name, suffix, func in PARTS:
        seconds, calls = 0.0, 0
        for (path, _line, fname), (primitive, _total, _tt, ct, _callers) in table.items():
            if fname == func and path.replace(os.sep, "/").endswith(suffix):
                seconds, calls = seconds + ct, calls + primitive
        out[name] = (round(seconds, 3), calls)
    return out


if __name__ == "__main__":
    sys.exit(main())
