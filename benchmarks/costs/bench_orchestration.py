"""How much the orchestration costs, how it scales, and how busy it keeps the device.

Every measurement runs `tunectl submit` end to end (a fresh driver process and a local Ray instance)
on the fault-injection task, whose configs cost exactly what they say, and reads the timing back from
the results dataset (every row has its start and finish time and its worker).

    python benchmarks/costs/bench_orchestration.py overhead   # per-item cost of a near-zero-cost task
    python benchmarks/costs/bench_orchestration.py memory     # peak driver memory as the run grows
    python benchmarks/costs/bench_orchestration.py scaling    # N logical workers on a fixed-cost task
    python benchmarks/costs/bench_orchestration.py overlap    # device busy fraction, compile ahead off / on
    python benchmarks/costs/bench_orchestration.py all

``overlap --spec SPEC --num-gpus N`` runs the same busy-fraction comparison on a real spec (on a GPU
host, e.g. configs/h200/flex_prefill.toml). Each prints a Markdown table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# Runs the CLI in this process and reports the process's own peak memory (VmHWM) and wall time.
_DRIVER = """
import json, sys, time, runpy
t0 = time.perf_counter()
sys.argv = ["tunectl", *json.loads(sys.argv[1])]
code = 0
try:
    runpy.run_module("tunectl", run_name="__main__")
except SystemExit as exc:
    code = exc.code or 0
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print("BENCH " + json.dumps({"code": code, "wall_s": time.perf_counter() - t0, "peak_rss_kib": hwm}))
"""


def spec_text(configs: str, n: int = 1, warmup: int = 0, samples: int = 1, resources: str = "") -> str:
    return (
        f'name = "bench"\ntask = "fault_injection"\n[shapes.n]\nvalues = [{n}]\n{configs}\n'
        f"[measure]\nwarmup = {warmup}\nmin_samples = {samples}\nmax_samples = {samples}\n"
        f"max_seconds = 10.0\nnoise_target = 1.0\n" + (f"[resources]\n{resources}\n" if resources else "")
    )


def variants(count: int) -> str:
    return f"variant = [{', '.join(map(str, range(count)))}]"


def submit(spec: Path, results: Path, *extra: str) -> dict[str, Any]:
    """`tunectl submit SPEC` in a fresh process; its wall time, peak memory and the run's rows."""
    from tunectl.store.results import read_results

    args = ["submit", str(spec), "--results", str(results), *extra]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "120"}
    done = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(args)], capture_output=True, text=True,
                          env=env, cwd=ROOT)  # fmt: skip
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("BENCH ")), None)
    if line is None or json.loads(line[6:])["code"] != 0:
        raise SystemExit(f"tunectl submit failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    out = json.loads(line[6:])
    out["rows"] = [r.to_row() for r in read_results(results)]
    return out


def by_worker(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    workers: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        workers[row["worker"]].append(row)
    for mine in workers.values():
        mine.sort(key=lambda r: r["finished_at"])
    return workers


def seconds(ts: Any) -> float:
    """Seconds since the epoch, from a record's time (a float) or a datetime."""
    return float(ts.timestamp()) if hasattr(ts, "timestamp") else float(ts)


def per_item_intervals(rows: list[dict[str, Any]]) -> list[float]:
    """Time from one item's finish to the next's on the same worker: the full cost of an item."""
    gaps = []
    for mine in by_worker(rows).values():
        ends = [seconds(r["finished_at"]) for r in mine]
        gaps += [b - a for a, b in itertools.pairwise(ends)]
    return gaps


def steady_throughput(rows: list[dict[str, Any]]) -> float:
    """Items per second summed over workers, each over its own span (workers start at different times)."""
    total = 0.0
    for mine in by_worker(rows).values():
        span = seconds(mine[-1]["finished_at"]) - seconds(mine[0]["started_at"])
        total += len(mine) / span if span > 0 else 0.0
    return total


def busy_fraction(rows: list[dict[str, Any]], warmup: int) -> float:
    """Share of each worker's span spent inside the kernel: the check call, warm-up and timed samples."""
    busy = span = 0.0
    for mine in by_worker(rows).values():
        ok = [r for r in mine if r["status"] == "ok"]
        busy += sum((r["num_samples"] + 1 + warmup) * r["mean_us"] / 1e6 for r in ok)
        span += seconds(mine[-1]["finished_at"]) - seconds(mine[0]["started_at"])
    return busy / span if span else 0.0


def bench_overhead(args: argparse.Namespace, tmp: Path) -> None:
    print("| workers | items | per-item median | per-item p90 | per-item mean | wall (incl. startup) |")
    print("|---|---|---|---|---|---|")
    gpu = ["--num-gpus", "1", "--compile-ahead"]
    for label, extra in (("1 GPU (logical; compile-ahead on)", gpu), ("1 CPU", ["--no-compile-ahead"])):
        for rep in range(args.repeat):
            spec = tmp / f"overhead-{rep}.toml"
            spec.write_text(spec_text(f'[configs]\nfault = "none"\n{variants(args.items)}'))
            out = submit(spec, tmp / f"overhead-{label[2:5]}-{rep}", *extra)
            gaps = sorted(per_item_intervals(out["rows"]))
            print(f"| {label} | {len(out['rows'])} | {statistics.median(gaps) * 1e3:.2f} ms | "
                  f"{gaps[int(0.9 * len(gaps))] * 1e3:.2f} ms | {statistics.fmean(gaps) * 1e3:.2f} ms | "
                  f"{out['wall_s']:.1f} s |")  # fmt: skip


# The library call `tunectl submit` makes, with a progress hook that samples the driver's memory.
_SAMPLER = """
import json, sys
from tunectl import api

def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024

class Sample:
    def start(self, run_id, total, placement):
        self.total, self.seen, self.rss = total, 0, {"0%": rss()}
    def record(self, record):
        self.seen += 1
        if self.seen * 4 % self.total < 4 and self.seen * 4 // self.total in (1, 2, 3, 4):
            self.rss[f"{self.seen * 100 // self.total}%"] = rss()
    def compiles(self, built, total, building):
        pass

progress = Sample()
options = api.SubmitOptions(cluster=api.Cluster(num_gpus=1))
api.submit(api.load_spec(sys.argv[1]), sys.argv[2], options, progress)
print("BENCH " + json.dumps(progress.rss))
"""


def bench_memory(args: argparse.Namespace, tmp: Path) -> None:
    """Driver RSS while records stream (placed, then at 25/50/75/100 % of the items), and the CLI's peak."""
    print("| items | RSS placed | 25 % | 50 % | 75 % | 100 % | `tunectl submit` peak (incl. winners table) |")
    print("|---|---|---|---|---|---|---|")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    for count in args.items_list:
        spec = tmp / f"memory-{count}.toml"
        spec.write_text(spec_text(f'[configs]\nfault = "none"\n{variants(count)}'))
        done = subprocess.run([sys.executable, "-c", _SAMPLER, str(spec), str(tmp / f"mem-lib-{count}")],
                              capture_output=True, text=True, env=env, cwd=ROOT)  # fmt: skip
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith("BENCH "))
        samples = [f"{v:.0f} MiB" for v in json.loads(line[6:]).values()]
        out = submit(spec, tmp / f"memory-{count}", "--num-gpus", "1")
        print(f"| {count} | {' | '.join(samples)} | {out['peak_rss_kib'] / 1024:.0f} MiB |")


def bench_scaling(args: argparse.Namespace, tmp: Path) -> None:
    base = None
    print(f"| workers | items | throughput (items/s) | vs N x 1 worker | item cost {2 * args.run_ms} ms |")
    print("|---|---|---|---|---|")
    for workers in args.workers:
        count = args.items_per_worker * workers
        spec = tmp / f"scaling-{workers}.toml"
        spec.write_text(spec_text(f'[configs]\nfault = "none"\nrun_ms = {args.run_ms}\n{variants(count)}'))
        out = submit(spec, tmp / f"scaling-{workers}", "--num-gpus", str(workers))
        rate = steady_throughput(out["rows"])
        base = base or rate / workers
        print(f"| {workers} | {len(out['rows'])} | {rate:.2f} | {rate / (workers * base):.3f} | |")


def bench_overlap(args: argparse.Namespace, tmp: Path) -> None:
    if args.spec:
        spec, warmup = Path(args.spec), args.warmup
    else:
        spec, warmup = tmp / "overlap.toml", 0
        configs = f'[configs]\nfault = "none"\ncompile_ms = {args.compile_ms}\nrun_ms = {args.kernel_ms}\n'
        spec.write_text(spec_text(configs + variants(args.overlap_items), samples=args.samples))
    print("| compile ahead | items | device busy fraction | wall |")
    print("|---|---|---|---|")
    for flag in ("--no-compile-ahead", "--compile-ahead"):
        out = submit(spec, tmp / f"overlap{flag}", "--num-gpus", str(args.num_gpus), flag)
        busy = busy_fraction(out["rows"], warmup)
        print(f"| {flag.removeprefix('--')} | {len(out['rows'])} | {busy:.3f} | {out['wall_s']:.1f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", choices=["overhead", "memory", "scaling", "overlap", "all"])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--items-list", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--items-per-worker", type=int, default=40)
    parser.add_argument("--run-ms", type=float, default=50.0)
    parser.add_argument(
        "--compile-ms", type=float, default=40.0, help="overlap: the compiler stand-in's time"
    )
    parser.add_argument("--kernel-ms", type=float, default=10.0, help="overlap: one kernel call's time")
    parser.add_argument("--overlap-items", type=int, default=60)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--spec", help="overlap: a real spec instead of the stand-in")
    parser.add_argument("--warmup", type=int, default=0, help="overlap --spec: the spec's warmup count")
    parser.add_argument("--num-gpus", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-orch-") as tmp:
        for what in ("overhead", "memory", "scaling", "overlap") if args.what == "all" else (args.what,):
            started = time.perf_counter()
            print(f"\n## {what}\n")
            globals()[f"bench_{what}"](args, Path(tmp))
            print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
