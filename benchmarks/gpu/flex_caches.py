"""Does a FlexAttention decode config name one kernel? The same flex configs compiled in fresh Inductor
caches, each cache in a process of its own, then timed and their kernels listed.

Two ways to compile:

- ``pinned``: as this tree compiles them (``tunectl.tasks._flex_packages.pinned_options``): Inductor
  times no kernel's launch setting on the device;
- ``inductor``: Inductor's default, where the first call times each candidate setting of the kernels
  around the attention one (the split-merging reduction, the pointwise ones) and keeps the fastest
  in its cache.

In a run, that first call is a compile process's, on the GPU a worker is measuring on. So each
process here makes its first calls while another process loads the GPU (``--load``: 8192^3 bf16
products, as ``drift_demo.py``'s load, in bursts of ``--load-on`` s every ``--load-on + --load-off``
s), then stops the load and times every call with the tuner's sampler (cold L2, difference method,
CUDA graphs: ``--rounds`` rounds of ``--samples`` samples) and lists its kernels (``torch.profiler``:
name, grid, block). Per (way, point, config) the table gives each cache's median, their spread
(greatest over least) and how many distinct kernel lists the caches ran.

    source /tmp/tunectl-site/env.sh && PYTHONPATH=.:$PYTHONPATH python benchmarks/gpu/flex_caches.py \\
        --out $OUT/flex_caches.json
    python benchmarks/gpu/flex_caches.py --device cpu --points 16:1:64 --configs 0 --caches 2 --rounds 1 \\
        --samples 3 --load 0

On a CPU it checks the plumbing only (flex compiled for the CPU, the host's clock), not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.gpu.drift_demo import LOAD
from benchmarks.gpu.flex_paths import (
    SPEC,
    config_label,
    decode_static,
    kernels,
    parse_points,
    prepare_compiled,
    time_paths,
)

WAYS = ("pinned", "inductor")
DEFAULT_POINTS = "128:1:1024,128:1:8192,128:4:1024,16:1:8192"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Flex decode configs compiled in fresh caches, timed.")
    parser.add_argument("--spec", default=str(SPEC))
    parser.add_argument("--points", default=DEFAULT_POINTS, help="page:batch:kv_len,... or all")
    parser.add_argument("--configs", default="", help="indices of the spec's flex configs (default all)")
    parser.add_argument("--caches", type=int, default=3, help="fresh caches (processes) per way")
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--load", type=int, default=1, help="1: load the GPU during the first calls")
    parser.add_argument("--load-on", type=float, default=0.05)
    parser.add_argument("--load-off", type=float, default=0.05)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)  # a way, run in this process
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def child(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One cache (this process's): every chosen (point, config) compiled the way ``args.child`` says,
    its first call under the load, then timed and listed."""
    from tunectl.tasks import _flex_packages
    from tunectl.tasks.registry import get_task

    if args.child == "inductor":  # this benchmark's own switch: Inductor's default settings
        setattr(_flex_packages, "pinned_options", dict)  # noqa: B010
    task = get_task("flash_decode")
    loader = None
    if args.load and args.device.startswith("cuda"):
        loader = subprocess.Popen([sys.executable, "-c", LOAD, "0", str(args.load_on), str(args.load_off)])
    calls, rows = [], []
    try:
        for page, batch, kv_len in parse_points(args.points):
            static, configs = decode_static(args.spec, page)
            shape = {"batch": batch, "kv_len": kv_len, "q_len": 1}
            inputs = task.build_inputs(static, shape, args.device)
            for i, config in enumerate(configs):
                if args.configs and str(i) not in args.configs.split(","):
                    continue
                fn, _, info = prepare_compiled(task, (static, shape, config), inputs, args.device)
                calls.append(fn)
                rows.append({"page_size": page, **shape, "config": config, "first_s": info["first_call_s"]})
    finally:
        if loader is not None:
            loader.kill()
            loader.wait()
    for fn, row in zip(calls, rows, strict=True):
        rounds = time_paths({"x": fn}, args.device, args.rounds, args.samples)["x"]
        row["median_us"] = statistics.median(rounds)
        row["kernels"] = sorted(kernels(fn, args.device))
    return rows


def table(results: dict[str, list[list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per (way, point, config): each cache's median, the spread, the distinct kernel lists."""
    out = []
    for way, caches in results.items():
        for rows in zip(*caches, strict=True):
            first = rows[0]
            times = [r["median_us"] for r in rows]
            out.append(
                {
                    "way": way,
                    "point": f"{first['page_size']}:{first['batch']}:{first['kv_len']}",
                    "config": config_label(first["config"]),
                    "medians_us": [round(t, 2) for t in times],
                    "spread": round(max(times) / min(times), 3),
                    "kernel_lists": len({tuple(r["kernels"]) for r in rows}),
                }
            )
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return
    results: dict[str, list[list[dict[str, Any]]]] = {}
    names = ("spec", "points", "configs", "rounds", "samples", "load", "load_on", "load_off", "device")
    passed = [x for name in names for x in (f"--{name.replace('_', '-')}", str(getattr(args, name)))]
    for way in args.ways.split(","):
        results[way] = []
        for _ in range(args.caches):
            with tempfile.TemporaryDirectory(prefix="flex-caches-") as tmp:
                env = {"TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor", "TRITON_CACHE_DIR": f"{tmp}/triton"}
                done = subprocess.run(
                    [sys.executable, __file__, *passed, "--child", way],
                    env={**os.environ, **env},
                    capture_output=True,
                    text=True,
                    check=False,
                )
            if done.returncode != 0:
                raise SystemExit(f"a {way} process failed: {done.stderr.strip().splitlines()[-1:]}")
            results[way].append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = table(results)
    for r in rows:
        head = f"{r['way']:<8} {r['point']:<12} {r['config']:<28} {r['spread']:>6.3f}"
        print(f"{head} {r['kernel_lists']} kernel list(s)  {r['medians_us']}")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows, "raw": results}, indent=1))


if __name__ == "__main__":
    main()
