"""What a worker spends getting a FlexAttention kernel that a compile process built: a package (an
Inductor standalone artifact) loaded, against torch.compile with Inductor's caches warm (Dynamo tracing,
the FX-graph cache lookup, loading the module).

One prefill point and its option sets (on CUDA: configs/h200/flex_prefill.toml's static key at
document-causal, batch 2 x 4096, and that spec's configs; on the CPU: a small point and a few sets).
Three fresh processes share one compile cache, as a run's compile processes and workers do:

1. build: per config, the package (``FlexPrefill.build_ahead``) and the torch.compile kernel (prepared and
   called once, with packages off), each timed: a cold compile each;
2. load, packages on; 3. load, packages off (``TUNECTL_FLEX_AOT=0``): per config, prepare and first
   call (what a worker's ``compile_ms`` counts), the output's max error against the reference, and
   the median call time (a check that both ways run the same kernel, not a measurement method).

Each config's row is printed, and medians over the configs after the first (whose load also pays the
process's one-time costs) that built both ways.

    python benchmarks/costs/flex_load.py --device cuda [--cache DIR] [--json OUT.json]
    python benchmarks/costs/flex_load.py --device cpu
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tunectl.tasks.compile import cache_env

POINTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "cuda": (
        {
            "dtype": "bfloat16",
            "head_dim": 128,
            "num_q_heads": 32,
            "num_kv_heads": 8,
            "mask": "document_causal",
            "num_docs": 8,
            "window": (-1, -1),
        },
        {"batch": 2, "seq_len": 4096},
    ),
    "cpu": (
        {
            "dtype": "float32",
            "head_dim": 64,
            "num_q_heads": 4,
            "num_kv_heads": 2,
            "mask": "document_causal",
            "num_docs": 4,
            "window": (-1, -1),
        },
        {"batch": 1, "seq_len": 512},
    ),
}
CONFIGS: dict[str, list[dict[str, Any]]] = {
    "cuda": [
        {},
        {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
        {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
        {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
        {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3},
        {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
        {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "USE_TMA": True},
    ],
    "cpu": [
        {},
        {"BLOCK_M": 64, "BLOCK_N": 64},
        {"BLOCK_M": 128, "BLOCK_N": 64},
        {"BLOCK_M": 64, "BLOCK_N": 32},
        {"BLOCK_M": 128, "BLOCK_N": 128},
    ],
}
CALLS = 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--cache", help="compile cache root (default: a new temp dir: cold builds)")
    parser.add_argument("--json", help="write every row here")
    parser.add_argument("--phase", choices=("build", "load"), help=argparse.SUPPRESS)
    parser.add_argument("--aot", choices=("0", "1"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device here; use --device cpu", file=sys.stderr)
            return 2
    if args.phase:  # a child: one phase, its rows as JSON on the last line
        rows = build(args.device) if args.phase == "build" else load(args.device)
        print(json.dumps(rows))
        return 0
    root = args.cache or tempfile.mkdtemp(prefix="flex-load-")
    env = {**os.environ, **cache_env(root), "TUNECTL_FLEX_AOT": "1"}
    built = child(args.device, "build", env)
    with_aot = child(args.device, "load", env)
    without = child(args.device, "load", {**env, "TUNECTL_FLEX_AOT": "0"})
    rows = [
        {"config": b["config"], **b, "aot": a, "compile": c}
        for b, a, c in zip(built, with_aot, without, strict=True)
    ]
    report(rows, root)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def child(device: str, phase: str, env: dict[str, str]) -> list[dict[str, Any]]:
    cmd = [sys.executable, __file__, "--device", device, "--phase", phase]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the {phase} process failed (exit {done.returncode})")
    rows: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return rows


def build(device: str) -> list[dict[str, Any]]:
    from tunectl.tasks import _flex_packages
    from tunectl.tasks.compile import synchronize
    from tunectl.tasks.flex_prefill import FlexPrefill

    static, shape = POINTS[device]
    packages, compiled = FlexPrefill(aot=True), FlexPrefill(aot=False)
    inputs = compiled.build_inputs(static, shape, device)
    rows = []
    for config in CONFIGS[device]:
        row: dict[str, Any] = {"config": config}
        t0 = time.perf_counter()
        try:
            packages.build_ahead(static, shape, config, device, inputs)
            path = _flex_packages.aot_package(
                packages.name, packages.compile_key(static, shape, config), device
            )
            row["package"] = path is not None and path.is_file()
        except Exception as exc:
            row["package"], row["build_error"] = False, _flex_packages.why(exc)
        row["build_aot_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        try:
            compiled.prepare(static, shape, config, inputs)()
            synchronize(device)
        except Exception as exc:
            row["compile_error"] = _flex_packages.why(exc)
        row["build_compile_s"] = time.perf_counter() - t0
        rows.append(row)
    return rows


def load(device: str) -> list[dict[str, Any]]:
    """As a worker: per config, prepare + first call, then the call timed."""
    from tunectl.tasks import _flex, _flex_packages
    from tunectl.tasks.compile import synchronize, warm_up_libraries
    from tunectl.tasks.flex_prefill import FlexPrefill

    static, shape = POINTS[device]
    task = FlexPrefill()  # packages on or off as $TUNECTL_FLEX_AOT says
    # what a worker imports when it starts (the task's warm_up does it on CUDA), not per config
    warm_up_libraries(
        ("torch._inductor.compile_fx", "torch._inductor.package", "torch.nn.attention.flex_attention")
    )
    inputs = task.build_inputs(static, shape, device)
    reference = task.reference(static, shape, inputs)
    synchronize(device)
    rows = []
    for config in CONFIGS[device]:
        row: dict[str, Any] = {}
        loaded = _flex.aot_loads["loaded"]
        t0 = time.perf_counter()
        try:
            fn = task.prepare(static, shape, config, inputs)
            out = fn()
            synchronize(device)
        except Exception as exc:
            rows.append({"error": _flex_packages.why(exc)})
            continue
        row["load_ms"] = (time.perf_counter() - t0) * 1e3
        row["from_package"] = _flex.aot_loads["loaded"] > loaded
        row["max_err"] = float((out.float() - reference.float()).abs().max())
        row["call_us"] = call_time(fn, device) * 1e6
        rows.append(row)
        del out
    return rows


def call_time(fn: Any, device: str) -> float:
    """Median seconds of one call over CALLS calls, each synchronized (a parity check)."""
    from tunectl.tasks.compile import synchronize

    for _ in range(3):
        fn()
    synchronize(device)
    times = []
    for _ in range(CALLS):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def report(rows: list[dict[str, Any]], root: str) -> None:
    print(f"compile cache: {root}")
    print(f"{'config':<62} {'build aot s':>11} {'build tc s':>10} {'load aot ms':>11} {'load tc ms':>10} "
          f"{'call aot us':>11} {'call tc us':>10}")  # fmt: skip
    for r in rows:
        a, c = r["aot"], r["compile"]
        label = " ".join(f"{k}={v}" for k, v in r["config"].items()) or "(default)"
        notes = [f"{k}: {r[k]}" for k in ("build_error", "compile_error") if k in r]
        notes += [f"load ({way}): {x['error']}" for way, x in (("aot", a), ("tc", c)) if "error" in x]
        if "load_ms" in a and not a.get("from_package"):
            notes.append("no package: compiled")
        print(f"{label:<62} {r['build_aot_s']:>11.2f} {r['build_compile_s']:>10.2f} {_f(a, 'load_ms'):>11} "
              f"{_f(c, 'load_ms'):>10} {_f(a, 'call_us'):>11} {_f(c, 'call_us'):>10}"
              + "".join(f"  [{n}]" for n in notes))  # fmt: skip
    # the first config of a process also pays its one-time costs (CUDA context, first Inductor use)
    both = [r for r in rows[1:] if r["aot"].get("from_package") and "load_ms" in r["compile"]]
    if not both:
        print("no config after the first loaded from a package")
        return
    aot = statistics.median(r["aot"]["load_ms"] for r in both)
    tc = statistics.median(r["compile"]["load_ms"] for r in both)
    ratio = statistics.median(r["aot"]["call_us"] / r["compile"]["call_us"] for r in both)
    err = max(max(r["aot"]["max_err"], r["compile"]["max_err"]) for r in both)
    print(f"median over {len(both)} config(s) after the first: load {aot:.1f} ms from a package vs "
          f"{tc:.1f} ms through torch.compile with warm caches ({tc / aot:.1f}x); "
          f"call time aot/torch.compile {ratio:.3f}; max abs error vs reference {err:.2e}")  # fmt: skip


def _f(row: dict[str, Any], name: str) -> str:
    return f"{row[name]:.1f}" if name in row else "-"


if __name__ == "__main__":
    sys.exit(main())
