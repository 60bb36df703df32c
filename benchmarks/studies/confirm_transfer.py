"""Do a config's times carry from the held-out run's workers to a confirming process? Read from records.

`bash benchmarks/gpu/holdout_h200.sh confirm P` times every selectable config at held-out shapes in a
tunectl run (its workers load the kernels compile processes built), then confirms each entry's
candidates at the same shapes in one fresh process (`benchmarks/studies/confirm_holdout.py
--by-cell ''`, the JSON `confirm-exact-pP.json`; it lists, per shape, each candidate's time). This
sets each candidate's confirming time beside the held-out run's median of the same config at the
same shape, on the same GPU, and summarises the ratio per backend and batch range::

    bash benchmarks/gpu/holdout_h200.sh restore   # the holdout archives into /tmp/holdout-results
    PYTHONPATH=. python benchmarks/studies/confirm_transfer.py --results /tmp/holdout-results \\
        --confirm benchmarks/results/confirm_h200_2026-12-04b.json --seeds 107 108 109
    PYTHONPATH=. python benchmarks/studies/confirm_transfer.py --results /tmp/holdout-results \\
        --confirm benchmarks/results/confirm_h200_2026-12-04.json --seeds 104 105 106 \\
        --sitting "cold L2 (second machine)"   # confirmed on another machine than the held-out runs
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.studies.h200_archive import require
from tunectl.core.keys import key_text, make_key
from tunectl.store.results import read_results

SHAPE = re.compile(r"seed (\d+): batch=(\d+), kv_len=(\d+), q_len=1: .*?\((.*)\)$")
CANDIDATE = re.compile(r"(\{[^{}]*\}) ([0-9.]+) µs")
BATCHES = ((1, 2), (3, 16), (17, 256))
OFF = 0.03  # a time this far from the held-out run's is counted as not carried


def confirmed_times(shapes: Sequence[str]) -> list[tuple[int, int, int, dict[str, Any], float]]:
    """(seed, batch, kv_len, config, µs) of every candidate a confirming run timed, from its lines."""
    out = []
    for line in shapes:
        m = SHAPE.match(line)
        if m is None:  # a shape with one candidate (nothing timed), or the method's line
            continue
        seed, batch, kv_len = int(m[1]), int(m[2]), int(m[3])
        for c in CANDIDATE.finditer(m[4]):
            out.append((seed, batch, kv_len, ast.literal_eval(c[1]), float(c[2])))
    return out


def held_out_runs(results: Path, page: str, seeds: Sequence[int]) -> dict[int, str]:
    """The held-out run of each seed at ``page``, from the confirm step's ``confirm-runs.txt``."""
    runs = {}
    for line in (results / "confirm-runs.txt").read_text().splitlines():
        p, seed, _, run = line.split()
        if p == page and int(seed) in seeds:
            runs[int(seed)] = run
    return runs


def ratios(results: Path, pages: dict[str, Any], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Each confirmed candidate's time over the held-out run's median of it, at the same shape;
    ``pages``: the confirming JSON's figures per page."""
    out = []
    for page, found in pages.items():
        runs = held_out_runs(results, page, seeds)
        medians = {
            (r.run_id, r.shape_key, r.config_key): r.median_us
            for r in read_results(results, run_ids=list(runs.values()))
            if r.median_us
        }
        for seed, batch, kv_len, config, us in confirmed_times(found["shapes"]):
            if seed not in runs:
                continue
            shape = key_text(make_key({"batch": batch, "kv_len": kv_len, "q_len": 1}))
            held = medians.get((runs[seed], shape, key_text(make_key(config))))
            if held:
                out.append({"page": page, "seed": seed, "batch": batch, "kv_len": kv_len,
                            "backend": config["backend"], "config": config, "ratio": us / held})  # fmt: skip
    return out


def summary(found: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per backend and batch range: how many, the median ratio, the median distance from 1, how many
    more than ``OFF`` away."""
    groups: dict[str, list[float]] = defaultdict(list)
    for f in found:
        lo, hi = next(b for b in BATCHES if b[0] <= f["batch"] <= b[1])
        groups[f"{f['backend']}, batch {lo}-{hi}"].append(f["ratio"])
    return {
        name: {
            "n": len(rs),
            "median_ratio": round(statistics.median(rs), 4),
            "median_off": round(statistics.median(abs(r - 1) for r in rs), 4),
            "over_3pct": sum(abs(r - 1) > OFF for r in rs),
            "range": [round(min(rs), 3), round(max(rs), 3)],
        }
        for name, rs in sorted(groups.items())
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True, help="the holdout archives unpacked")
    parser.add_argument("--confirm", type=Path, required=True, help="confirm_holdout.py's JSON")
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--sitting", help="the JSON's key of one sitting, where it holds several")
    parser.add_argument("--json", type=Path, help="also write the ratios and the summary here")
    args = parser.parse_args()
    confirm = json.loads(args.confirm.read_text())
    confirm = confirm[args.sitting] if args.sitting else confirm
    found = ratios(require(args.results), confirm.get("page", confirm), args.seeds)
    table = summary(found)
    print("| backend, batch | candidates | confirming / held-out, median | median off | > 3 % off | range |")
    print("|---|---|---|---|---|---|")
    for name, s in table.items():
        off, (lo, hi), ratio = 100 * s["median_off"], s["range"], s["median_ratio"]
        print(f"| {name} | {s['n']} | {ratio:.3f} | {off:.1f} % | {s['over_3pct']} | {lo:.3f}-{hi:.3f} |")
    if args.json:
        args.json.write_text(json.dumps({"summary": table, "ratios": found}, indent=1, default=str))


if __name__ == "__main__":
    main()
