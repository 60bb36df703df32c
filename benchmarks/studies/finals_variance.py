"""Do the finals' 95 % intervals hold from one run to the next on a loaded CPU?

Runs a small CPU spec of the quickstart's kind (paged decode attention, 2 batch sizes x 6 configs,
finals of 8 rounds) ``--runs`` times, each ``tunectl submit`` a fresh process with a local Ray
instance, while ``--load`` processes busy-loop on the machine's cores. From every run's finals it
takes each finalist's paired speedup over the default and its 95 % interval, and per (shape, config)
seen in at least 3 runs it counts:

- **coverage**: how often a run's interval holds the other runs' pooled estimate (their geometric
  mean, leave-one-out). Honest 95 % intervals hold it about 94 % of the time with 10 runs (the
  pooled estimate has an error of its own: 1.96 / sqrt(1 + 1/(N-1)) standard errors);
- **non-overlap**: how often two runs' intervals do not overlap at all (honest ones: under 1 %);
- **dispersion**: the spread of the runs' log estimates over the typical half-width / 1.96 the runs
  claim (honest: about 1).

    python benchmarks/studies/finals_variance.py --runs 10 --load 1 --out /tmp/finals_variance \\
        --json benchmarks/results/finals_variance.json --label before
    python benchmarks/studies/finals_variance.py --analyse /tmp/finals_variance/finals.json

The JSON keeps every run's finals, so ``--analyse`` recomputes the figures without measuring again.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SPEC = """\
name = "finals_variance"
description = "the quickstart's kind, smaller: 2 batch sizes x 6 configs, finals of 8 rounds"
task = "decode_attention"

[static]
dtype = "float32"
num_q_heads = 8
num_kv_heads = 2
head_dim = 64
page_size = 16

[shapes.batch]
values = [1, 4]
bucket = "pow2"

[shapes.kv_len]
values = [2048]
bucket = "ceil"

[configs]
num_splits = [1, 2, 4]
gqa = ["expand", "grouped"]
gather = "index"

[measure]
warmup = 2
min_samples = 10
noise_target = 0.02
max_seconds = 0.5
"""


@dataclass(frozen=True)
class Final:
    """One finalist's paired speedup over the default in one run's finals."""

    run: int
    shape: str
    config: str
    speedup: float
    lo: float
    hi: float


def busy_loop() -> None:
    while True:
        pass


def measure(out: Path, runs: int, load: int, spec_text: str) -> tuple[list[Final], list[float]]:
    """``runs`` tuning runs of ``spec_text`` under ``load`` busy-looping processes; their finals and
    each run's wall time."""
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "spec.toml"
    spec.write_text(spec_text)
    loaders = [multiprocessing.Process(target=busy_loop, daemon=True) for _ in range(load)]
    for loader in loaders:
        loader.start()
    finals: list[Final] = []
    walls = []
    try:
        for run in range(runs):
            results = out / f"run{run}"
            started = time.monotonic()
            command = ["tunectl", "submit", str(spec), "--results", str(results)]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            walls.append(time.monotonic() - started)
            finals.extend(finals_of(results, run))
            print(f"run {run + 1}/{runs}: {walls[-1]:.0f} s", file=sys.stderr, flush=True)
    finally:
        for loader in loaders:
            loader.terminate()
    return finals, walls


def finals_of(results: Path, run: int) -> list[Final]:
    from tunectl.core.record import Phase
    from tunectl.store.results import read_results

    out = []
    for r in read_results(results):
        if r.phase is Phase.FINAL and r.ok and not r.is_default and r.speedup and r.speedup_lo:
            hi = r.speedup_hi or math.inf
            out.append(Final(run, r.shape_key, r.config_key, r.speedup, r.speedup_lo, hi))
    return out


def analyse(finals: Sequence[Final], min_runs: int = 3) -> dict[str, Any]:
    """Coverage, non-overlap and dispersion over every (shape, config) seen in ``min_runs`` runs."""
    groups: dict[tuple[str, str], list[Final]] = defaultdict(list)
    for f in finals:
        groups[(f.shape, f.config)].append(f)
    held = missed = pairs = apart = 0
    ratios, rows = [], []
    for (shape, config), group in sorted(groups.items()):
        if len(group) < min_runs:
            continue
        logs = [math.log(f.speedup) for f in group]
        for i, f in enumerate(group):
            pooled = math.exp(statistics.fmean(logs[:i] + logs[i + 1 :]))
            held, missed = (held + 1, missed) if f.lo <= pooled <= f.hi else (held, missed + 1)
        for a, b in itertools.combinations(group, 2):
            pairs += 1
            apart += a.hi < b.lo or b.hi < a.lo
        claimed = statistics.median(math.log(f.hi / f.lo) / 2 / 1.96 for f in group)
        spread = statistics.stdev(logs)
        ratios.append(spread / claimed if claimed > 0 else math.inf)
        rows.append(
            {
                "shape": shape,
                "config": config,
                "runs": len(group),
                "speedup_min": min(f.speedup for f in group),
                "speedup_max": max(f.speedup for f in group),
                "median_half_width_pct": 100 * statistics.median((f.hi / f.lo) ** 0.5 - 1 for f in group),
                "dispersion": spread / claimed if claimed > 0 else math.inf,
            }
        )
    total = held + missed
    return {
        "groups": rows,
        "num_intervals": total,
        "coverage": held / total if total else math.nan,
        "num_pairs": pairs,
        "non_overlap": apart / pairs if pairs else math.nan,
        "median_dispersion": statistics.median(ratios) if ratios else math.nan,
    }


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| shape | config | runs | speedup min-max | median half-width | dispersion |",
        "|---|---|---|---|---|---|",
    ]
    for g in summary["groups"]:
        lines.append(
            f"| {g['shape']} | {g['config']} | {g['runs']} | {g['speedup_min']:.2f}-{g['speedup_max']:.2f}x "
            f"| {g['median_half_width_pct']:.1f} % | {g['dispersion']:.2f} |"
        )
    lines.append(
        f"\ncoverage {100 * summary['coverage']:.0f} % of {summary['num_intervals']} intervals; "
        f"non-overlap {100 * summary['non_overlap']:.1f} % of {summary['num_pairs']} pairs; "
        f"median dispersion {summary['median_dispersion']:.2f}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--spec", type=Path, help="a CPU spec to run instead of the built-in one")
    parser.add_argument("--load", type=int, default=1, help="busy-looping processes beside the runs")
    parser.add_argument("--out", type=Path, default=Path("/tmp/finals_variance"))
    parser.add_argument("--json", type=Path, help="add this measurement to a JSON file, under --label")
    parser.add_argument("--label", default="run")
    parser.add_argument("--analyse", type=Path, help="a finals.json of an earlier measurement")
    args = parser.parse_args()
    if args.analyse:
        data = json.loads(args.analyse.read_text())
        print(table(analyse([Final(**f) for f in data["finals"]])))
        return
    if args.runs < 3:
        parser.error("--runs must be at least 3: coverage pools the other runs' estimates")
    spec_text = args.spec.read_text() if args.spec else SPEC
    finals, walls = measure(args.out, args.runs, args.load, spec_text)
    summary = analyse(finals)
    record = {"label": args.label, "spec": str(args.spec or "built-in"), "runs": args.runs, "load": args.load}
    record["run_seconds"] = walls
    record.update(summary=summary, finals=[asdict(f) for f in finals])
    (args.out / "finals.json").write_text(json.dumps(record, indent=1))
    if args.json:
        saved = json.loads(args.json.read_text()) if args.json.exists() else {}
        saved[args.label] = {k: v for k, v in record.items() if k != "finals"}
        args.json.write_text(json.dumps(saved, indent=1))
    print(table(summary))


if __name__ == "__main__":
    main()
