"""Does a fleet tune faster? Real sweeps on 1 and N GPUs of one host, compile interference, and a
simulation of larger fleets fed with the per-item times those sweeps recorded.

    python benchmarks/costs/fleet.py sweeps --out DIR [--grids decode prefill] [--gpus 2 1]
        each grid on N GPUs and on 1, back to back, first with empty compile caches (cold), then again
        with the caches the cold run left (warm); a Markdown table and DIR/sweeps.json
    python benchmarks/costs/fleet.py interference --out DIR
        the same decode configs timed with compile processes idle, busy compiling a FlexAttention
        grid on the same GPU, and idle again: busy / idle per config against the noise
    python benchmarks/costs/fleet.py simulate --sweeps DIR/sweeps.json
        8, 32 and 128 GPUs over 1-16 nodes: workers that compile for themselves (before) against
        compile processes per node (now), fed with the recorded per-item times
    python benchmarks/costs/fleet.py table --sweeps DIR/sweeps.json   # the sweeps' table again

Run on the GPU host from the project root (sweeps and interference need GPUs; simulate does not).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunectl.report.worker_time import WorkerTime

ROOT = Path(__file__).resolve().parents[2]
GRIDS = {
    "decode": "configs/h200/flash_decode_page256.toml",
    "prefill": "configs/h200/flex_prefill.toml",
}


def tunectl(args: list[str], gpus: int | None) -> float:
    """`tunectl ARGS` in a fresh process on the first ``gpus`` GPUs; its wall seconds."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "160"}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(gpus)))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tunectl", *args], env=env, cwd=ROOT, text=True,
                          capture_output=True)  # fmt: skip
    wall = time.perf_counter() - started
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-6:])
    print(f"  $ tunectl {' '.join(args)}  ({wall:.0f} s)\n{tail}", flush=True)
    if done.returncode != 0:
        raise SystemExit(f"tunectl failed ({done.returncode})")
    return wall


# -- what a run's rows say ----------------------------------------------------------------------------


def ts(value: Any) -> float:
    return float(value.timestamp()) if hasattr(value, "timestamp") else float(value)


def run_figures(results: Path, warmup: int) -> dict[str, Any]:
    """Span, throughput, compile time and busy fraction of the one run in ``results``."""
    from tunectl.report.worker_time import worker_times
    from tunectl.store.results import read_results
    from tunectl.store.runs import list_runs

    (info,) = list_runs(results)
    records = read_results(results, run_ids=[info.run_id])
    rows = [r.to_row() for r in records]
    busy: dict[str, float] = {}
    split: defaultdict[str, float] = defaultdict(float)
    for worker in worker_times(records, warmup=warmup):
        busy[worker.worker] = round(worker.busy, 3)
        for part, seconds in time_parts(worker).items():
            split[part] += seconds
    span = max(ts(r["finished_at"]) for r in rows) - min(ts(r["started_at"]) for r in rows)
    grid_items = [r for r in rows if r["phase"] in ("measure", "screen")]
    loads = [r["compile_ms"] for r in grid_items if r["compile_ms"] is not None]
    statuses: dict[str, int] = defaultdict(int)
    for row in rows:
        statuses[row["status"]] += 1
    return {
        "run_id": info.run_id, "records": len(rows), "span_s": round(span, 2),
        "records_per_s": round(len(rows) / span, 3) if span else 0.0,
        "worker_compile_s": round(sum((r["compile_ms"] or 0.0) for r in rows) / 1e3, 2),
        "builder_compile_s": info.compile.get("build_seconds", 0.0),
        "kernels_built": info.compile.get("built", 0), "kernels": info.compile.get("keys", 0),
        "compile_processes": info.compile.get("compile_processes", 0),
        "busy_fraction": busy, "statuses": dict(statuses),
        "worker_time_s": {part: round(v, 2) for part, v in split.items()},
        "median_load_ms": round(statistics.median(loads), 1) if loads else None,
        "per_kernel_build_s": info.compile.get("per_kernel_seconds", {}),
        "per_item": [
            {"kernel": kernel_of(row), "phase": row["phase"], "worker": row["worker"],
             "load_s": (row["compile_ms"] or 0.0) / 1e3,
             "run_s": ts(row["finished_at"]) - ts(row["started_at"]) - (row["compile_ms"] or 0.0) / 1e3}
            for row in rows if row["worker"]
        ],
    }  # fmt: skip


def kernel_of(row: dict[str, Any]) -> str | None:
    """The compile key of a row's config (its first arm's, for a comparison's row)."""
    from tunectl.core.keys import key_dict, key_from_text
    from tunectl.tasks.compile import compile_key
    from tunectl.tasks.registry import get_task

    parts = [key_dict(key_from_text(row[k])) for k in ("static_key", "shape_key", "config_key")]
    return compile_key(get_task(row["task"]), *parts)


def warmup_of(spec: str) -> int:
    import tomllib

    return int(tomllib.loads((ROOT / spec).read_text()).get("measure", {}).get("warmup", 0))


# -- sweeps -------------------------------------------------------------------------------------------


def cmd_sweeps(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done: list[dict[str, Any]] = []
    for grid in args.grids:
        spec = GRIDS[grid]
        for cache_state in ("cold", "warm"):
            for gpus in args.gpus:
                cache = out / f"cache-{grid}-{gpus}"
                if cache_state == "cold":
                    shutil.rmtree(cache, ignore_errors=True)
                results = out / f"results-{grid}-{gpus}-{cache_state}"
                shutil.rmtree(results, ignore_errors=True)
                extra = (
                    [] if args.compile_workers is None else ["--compile-workers", str(args.compile_workers)]
                )
                wall = tunectl(["submit", spec, "--results", str(results), "--compile-cache", str(cache),
                                *extra], gpus)  # fmt: skip
                figures = run_figures(results, warmup_of(spec))
                done.append({"grid": grid, "gpus": gpus, "caches": cache_state, "wall_s": round(wall, 1),
                             **figures})  # fmt: skip
                (out / "sweeps.json").write_text(json.dumps(done, indent=1))
    print(sweeps_table(done))


#: where a worker's span went, from its rows (``Record``: compile_ms, setup_ms, measure_ms, guard_ms)
TIME_PARTS = ("loading", "point set-up", "measuring", "of which guard", "of which kernel", "other")


def time_parts(worker: WorkerTime) -> dict[str, float]:
    """Seconds of one worker's span in each of ``TIME_PARTS`` (``tunectl.report.worker_time``); here
    "other" also holds its waits between calls."""
    return {
        "loading": worker.loading_s,
        "point set-up": worker.setup_s,
        "measuring": worker.measuring_s,
        "of which guard": worker.guard_s,
        "of which kernel": worker.kernel_s,
        "other": worker.other_s + worker.waiting_s,
    }


def sweeps_table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| grid | caches | GPUs | records | span | records/s | vs 1 GPU | compile in workers | "
        "compile in compile processes | kernels built | GPU busy (per worker) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    one = {(r["grid"], r["caches"]): r for r in runs if r["gpus"] == 1}
    for r in runs:
        base = one.get((r["grid"], r["caches"]))
        ratio = f"{base['span_s'] / r['span_s']:.2f}x" if base and r["gpus"] != 1 else "1"
        busy = ", ".join(f"{v:.2f}" for v in r["busy_fraction"].values())
        lines.append(
            f"| {r['grid']} | {r['caches']} | {r['gpus']} | {r['records']} | {r['span_s']:.1f} s | "
            f"{r['records_per_s']:.2f} | {ratio} | {r['worker_compile_s']:.1f} s | "
            f"{r['builder_compile_s']:.1f} s ({r['compile_processes']} processes) | "
            f"{r['kernels_built']}/{r['kernels']} | {busy} |"
        )
    split = [r for r in runs if r.get("worker_time_s")]
    if split:  # where the workers' spans went (summed over workers)
        lines += ["", "| grid | caches | GPUs | median loading per item | " + " | ".join(TIME_PARTS) + " |",
                  "|---|---|---|---|" + "---|" * len(TIME_PARTS)]  # fmt: skip
        for r in split:
            parts = " | ".join(f"{r['worker_time_s'].get(p, 0.0):.1f} s" for p in TIME_PARTS)
            load = f"{r['median_load_ms']:.0f} ms" if r.get("median_load_ms") is not None else "-"
            lines.append(f"| {r['grid']} | {r['caches']} | {r['gpus']} | {load} | {parts} |")
    return "\n".join(lines)


def cmd_table(args: argparse.Namespace) -> None:
    """The tables again from a sweeps JSON; ``--reread``: each run's figures read again from its results
    beside the JSON (where they are), so figures added since the sweep show too."""
    runs = json.loads(Path(args.sweeps).read_text())
    for r in runs if args.reread else []:
        results = Path(args.sweeps).parent / f"results-{r['grid']}-{r['gpus']}-{r['caches']}"
        if results.is_dir():
            r.update(run_figures(results, warmup_of(GRIDS[r["grid"]])))
    print(sweeps_table(runs))


# -- interference -------------------------------------------------------------------------------------

INTERFERENCE_SPEC = """
name = "compile-interference"
task = "flash_decode"
[static]
dtype = "bfloat16"
num_q_heads = 32
num_kv_heads = 8
head_dim = 128
page_size = 256
causal = true
window = -1
softcap = 0.0
sinks = false
[shapes.batch]
values = [1, 16, 64]
[shapes.kv_len]
values = [1024, 8192]
[shapes.q_len]
values = [1]
[[configs]]
backend = "fa4"
[[configs]]
backend = "fa2"
kv_page_size = 256
num_splits = [0, 4]
[[configs]]
backend = "sdpa"
sdpa_backend = "cudnn"
sdpa_gqa = "expand"
[search]
finalists = 0
[measure]
warmup = 3
min_samples = 50
max_samples = 400
noise_target = 0.01
max_seconds = 0.5
l2 = "cold"
mode = "graph"
"""

# Compile processes kept busy: each builds the FlexAttention prefill grid's kernels into an empty cache
# of its own, over and over, on the GPU that is measuring, until killed.
_COMPILE_LOAD = """
import sys, tempfile, os
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="ind-")
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="tri-")
from tunectl.tasks.compile import build
from tunectl.tasks.registry import get_task
from tunectl.core.plan import plan
from tunectl.core.spec import load_spec
items = list(plan(load_spec(sys.argv[1])).work_items())[int(sys.argv[2])::int(sys.argv[3])]
task = get_task(items[0].task)
while True:
    for item in items:
        try:
            build(task, dict(item.static), dict(item.shape), dict(item.config), "cuda:0")
        except Exception:
            pass
        import torch._dynamo
        torch._dynamo.reset()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="ind-")  # cold again
"""


def cmd_interference(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "interference.toml"
    spec.write_text(INTERFERENCE_SPEC)
    phases: dict[str, Path] = {}
    for phase in ("idle-1", "busy", "idle-2"):
        load = []
        if phase == "busy":
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "PYTHONPATH": str(ROOT)}
            load = [subprocess.Popen([sys.executable, "-c", _COMPILE_LOAD, GRIDS["prefill"], str(i),
                                      str(args.load)], env=env, cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    for i in range(args.load)]  # fmt: skip
            time.sleep(args.settle_s)  # let them get past their imports, into compiling
        try:
            phases[phase] = out / f"results-{phase}"
            shutil.rmtree(phases[phase], ignore_errors=True)
            tunectl(["submit", str(spec), "--results", str(phases[phase]), "--compile-workers", "0"], 1)
        finally:
            for proc in load:
                proc.kill()
    print(agreement_table(phases["idle-1"], phases["busy"], phases["idle-2"], ("idle", "busy")))


def agreement_table(first: Path, test: Path, again: Path, names: tuple[str, str]) -> str:
    """Each config's median in the runs under ``test`` against the runs before and after it (``first``,
    ``again``): the ratio, and whether it lies within twice the larger of the rows' noise and the
    two baseline runs' difference. ``names``: what the baseline and the test are called. Rows of a
    grid item only (finals are comparisons of their own)."""
    from tunectl.core.record import Record
    from tunectl.store.results import read_results

    rows = [
        {(r["shape_key"], r["config_key"]): r for r in map(Record.to_row, read_results(d))
         if r["status"] == "ok" and r["phase"] in ("measure", "screen")}
        for d in (first, test, again)
    ]  # fmt: skip
    base_name, test_name = names
    lines = [
        f"| shape | config | {base_name} µs | {test_name} µs | {base_name} again µs "
        f"| {test_name} / {base_name} | noise ({base_name}, {test_name}) | within |",
        "|---|---|---|---|---|---|---|---|",
    ]
    within = total = 0
    ratios = []
    for key, idle in sorted(rows[0].items()):
        busy, rerun = rows[1].get(key), rows[2].get(key)
        if busy is None or rerun is None:
            continue
        base = (idle["median_us"] + rerun["median_us"]) / 2
        ratio = busy["median_us"] / base
        spread = abs(idle["median_us"] - rerun["median_us"]) / base  # idle against idle: drift
        noise = max(idle["rel_noise"], busy["rel_noise"], rerun["rel_noise"], spread)
        ok = abs(ratio - 1) <= 2 * noise
        within += ok
        total += 1
        ratios.append(ratio)
        lines.append(f"| {key[0]} | {key[1]} | {idle['median_us']:.1f} | {busy['median_us']:.1f} | "
                     f"{rerun['median_us']:.1f} | {ratio:.3f} | {idle['rel_noise']:.1%}, "
                     f"{busy['rel_noise']:.1%} | {'yes' if ok else 'no'} |")  # fmt: skip
    import statistics

    if ratios:
        median, low, high = statistics.median(ratios), min(ratios), max(ratios)
        lines.append(f"\n{within} of {total} configs within noise; {test_name} / {base_name} median "
                     f"{median:.3f}, range {low:.3f}-{high:.3f}")  # fmt: skip
    return "\n".join(lines)


def cmd_agree(args: argparse.Namespace) -> None:
    """Two settings of one grid, side by side: each run's figures and the per-config agreement."""
    spec = GRIDS[args.grid]
    named = (("warm", args.first), (args.name, args.test), ("warm again", args.again))
    runs = [{"grid": args.grid, "gpus": 1, "caches": name, **run_figures(Path(d), warmup_of(spec))}
            for name, d in named]  # fmt: skip
    print(sweeps_table(runs) + "\n")
    print(agreement_table(Path(args.first), Path(args.test), Path(args.again), ("warm", args.name)))


# -- simulation ---------------------------------------------------------------------------------------


def cmd_simulate(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.costs.fleet_model import simulate_table

    runs = json.loads(Path(args.sweeps).read_text())
    print(simulate_table(runs, builders_per_gpu=args.builders_per_gpu, items_per_gpu=args.items_per_gpu))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("sweeps")
    p.add_argument("--out", required=True)
    p.add_argument("--grids", nargs="+", default=list(GRIDS), choices=list(GRIDS))
    p.add_argument("--gpus", nargs="+", type=int, default=[2, 1])
    p.add_argument("--compile-workers", type=int, help="compile processes per node (0: workers compile)")
    p = sub.add_parser("interference")
    p.add_argument("--out", required=True)
    p.add_argument("--load", type=int, default=8, help="compile processes kept busy")
    p.add_argument("--settle-s", type=float, default=20.0)
    p = sub.add_parser("agree", help="a setting against runs before and after it without it")
    p.add_argument("--grid", required=True, choices=list(GRIDS))
    p.add_argument("--first", required=True, help="results of the run before, without the setting")
    p.add_argument("--test", required=True, help="results of the run with it")
    p.add_argument("--again", required=True, help="results of the run after, without it")
    p.add_argument("--name", default="loaded ahead", help="what the setting is called")
    p = sub.add_parser("simulate")
    p.add_argument("--sweeps", required=True)
    p.add_argument("--builders-per-gpu", type=int, default=4)
    p.add_argument(
        "--items-per-gpu", type=int, default=60, help="the recorded sweep is repeated to this size"
    )
    p = sub.add_parser("table")
    p.add_argument("--sweeps", required=True)
    p.add_argument("--reread", action="store_true", help="read each run's figures again from its results")
    args = parser.parse_args()
    globals()[f"cmd_{args.what}"](args)


if __name__ == "__main__":
    main()
