"""The drift guard against an induced slowdown: the same decode configs timed three times.

    PYTHONPATH=. python benchmarks/gpu/drift_demo.py [--out DIR]      # on a GPU host, ~3 minutes

0. a warming run (not compared), so the compile cache is full before the baseline;
1. undisturbed (the baseline);
2. with a load process on the same GPU that, from ``--load-after`` seconds into the run, runs matrix
   products for ``--load-on`` seconds, rests ``--load-off`` seconds, and so on to the end of the run,
   the guard on (``measure.drift = "remeasure"``): measurements the load touches are made again,
   after waiting for the device to come back if need be;
3. the same load, the guard off (``measure.drift = "off"``): what the disturbed rows read without it.

Each run is a real ``tunectl submit`` (local Ray, one GPU worker). The table gives, per config and
shape, each run's median over the baseline's, and for the guarded run whether the reference moved
(``drift``) and how often the config was measured again; the summary counts rows more than 5 % off
the baseline in each disturbed run. The load shares the GPU by time-slicing, so any kernel running
while the load runs reads slower. The bursts come often (a second on, a second off, from the start):
a point's measurements take tens of milliseconds, so rarer bursts could miss a whole run's rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

SPEC = """\
name = "drift-demo"
task = "flash_decode"

[static]
dtype = "bfloat16"
num_q_heads = 32
num_kv_heads = 8
head_dim = 128
page_size = 128
causal = true
window = -1
softcap = 0.0
sinks = false

[shapes.batch]
values = [1, 4, 16, 64]

[shapes.kv_len]
values = [8192, 32768]

[shapes.q_len]
values = [1]

[[configs]]
backend = "fa4"

[[configs]]
backend = "fa4"
pack_gqa = false

[[configs]]
backend = "sdpa"
sdpa_backend = "cudnn"
sdpa_gqa = "expand"

[measure]
l2 = "cold"
mode = "graph"
max_seconds = 0.25
drift = "{drift}"
"""

LOAD = textwrap.dedent(
    """
    import sys, time, torch
    after, on, off = map(float, sys.argv[1:4])
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    time.sleep(after)
    while True:  # until the run ends and this process is killed
        end = time.time() + on
        while time.time() < end:
            for _ in range(4):
                a @ a
            torch.cuda.synchronize()
        time.sleep(off)
    """
)


def submit(out: Path, name: str, drift: str, load: tuple[float, ...] | None) -> str:
    spec = out / f"{name}.toml"
    spec.write_text(SPEC.format(drift=drift).replace('"drift-demo"', f'"drift-demo-{name}"'))
    loader = None
    if load is not None:
        loader = subprocess.Popen([sys.executable, "-c", LOAD, *map(str, load)])
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tunectl", "submit", str(spec), "--results", str(out / "results")],
            capture_output=True,
            text=True,
            timeout=200,
        )
    finally:
        if loader is not None:
            loader.kill()
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
    listed = subprocess.run(
        [sys.executable, "-m", "tunectl", "runs", "--results", str(out / "results"), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    runs = [r for r in json.loads(listed.stdout) if r["name"] == f"drift-demo-{name}"]
    return sorted(runs, key=lambda r: r["created_at"])[-1]["run_id"]


def rows(out: Path, run_id: str) -> dict[tuple[str, str], object]:
    from tunectl.core.record import Phase
    from tunectl.store.results import read_results

    return {
        (r.shape_key, r.config_key): r
        for r in read_results(out / "results", [run_id])
        if r.ok and r.phase is Phase.MEASURE
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/drift-demo"))
    parser.add_argument("--load-after", type=float, default=0.0, help="seconds before the first burst")
    parser.add_argument("--load-on", type=float, default=1.0, help="seconds of each burst")
    parser.add_argument("--load-off", type=float, default=1.0, help="seconds between bursts")
    parser.add_argument("--no-unguarded", action="store_true", help="skip run 3 (a third less time)")
    parser.add_argument(
        "--no-warm",
        action="store_true",
        help="skip the warming run (its compiles would share the baseline's GPU)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_warm:  # fills the compile cache, so no run is timed beside compile processes
        submit(args.out, "warming", "off", None)
    base = rows(args.out, submit(args.out, "baseline", "remeasure", None))
    load = (args.load_after, args.load_on, args.load_off)
    guarded = rows(args.out, submit(args.out, "guarded", "remeasure", load))
    bare = {} if args.no_unguarded else rows(args.out, submit(args.out, "unguarded", "off", load))
    print(
        f"Load in runs 2 and 3: 8192^3 bf16 products in bursts of {args.load_on} s every "
        f"{args.load_on + args.load_off} s, from {args.load_after} s into the run.\n"
    )
    print("| shape | config | baseline µs | guarded / baseline | drift | remeasured | unguarded / baseline |")
    print("|---|---|---|---|---|---|---|")
    off: dict[str, list[float]] = {"guarded": [], "unguarded": []}
    for key in sorted(base):
        b, g, u = base[key], guarded.get(key), bare.get(key)
        rg = g.median_us / b.median_us if g else None  # type: ignore[attr-defined]
        ru = u.median_us / b.median_us if u else None  # type: ignore[attr-defined]
        if rg is not None:
            off["guarded"].append(rg)
        if ru is not None:
            off["unguarded"].append(ru)
        print(
            f"| {key[0]} | {key[1]} | {b.median_us:.1f} | {_x(rg)} | "  # type: ignore[attr-defined]
            f"{getattr(g, 'drift', None)} | {getattr(g, 'remeasured', None)} | {_x(ru)} |"
        )
    print()
    for name, ratios in off.items():
        if not ratios:
            continue
        far = sum(abs(r - 1) > 0.05 for r in ratios)
        med = statistics.median(ratios) if ratios else float("nan")
        print(f"- {name}: {far} of {len(ratios)} rows more than 5 % off the baseline; median ratio {med:.3f}")
    flagged = [g for g in guarded.values() if getattr(g, "remeasured", 0)]
    print(
        f"- guarded run: {len(flagged)} rows measured again, {sum(bool(g.drift) for g in guarded.values())}"  # type: ignore[attr-defined]
        " still flagged after their re-measures"
    )


def _x(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.3f}"


if __name__ == "__main__":
    main()
