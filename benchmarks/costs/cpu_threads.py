"""Does a CPU worker's thread count steady its times? A spec (the CPU quickstart by default) tuned on
this machine's local Ray instance with the worker timing on every core, then on every core but one
(the default, ``tunectl.orchestrator.cluster.cpu_threads``), alternately, ``--runs`` times each.

    python benchmarks/costs/cpu_threads.py [--runs 2] [--spec configs/quickstart.toml] [--out F.json]

Per run: the rows whose slowest sample (a finals row: its slowest round) read more than 10 times its
median, the rows' median noise, the finals rows noisier than the spec's noise target and the
noisiest, the winners' 95 % intervals (their width over the speedup, the median over points), the
winners and the wall time.
The driver and Ray's own processes run on the same cores as the worker, as in the quickstart.
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tunectl.core.spec import parse_spec  # noqa: E402
from tunectl.decide.select import select_winners  # noqa: E402
from tunectl.store.results import read_results  # noqa: E402


def with_threads(text: str, threads: int) -> str:
    """The spec's text with ``[resources] cpu_threads`` set."""
    line = f"cpu_threads = {threads}"
    return (
        text.replace("[resources]", f"[resources]\n{line}")
        if "[resources]" in text
        else f"{text}\n[resources]\n{line}\n"
    )


def _known(value: float | None) -> float:
    """A statistic every measured row has (its slowest sample, its noise)."""
    assert value is not None
    return value


def one_run(text: str, threads: int, where: Path) -> dict[str, Any]:
    spec, results = where / f"spec-{threads}.toml", where / "results"
    spec.write_text(with_threads(text, threads))
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tunectl", "submit", str(spec), "--results", str(results)],
        check=True,
        capture_output=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    wall = time.perf_counter() - began
    rows = [r for r in read_results(results) if r.median_us]
    finals = [r for r in rows if r.phase.value == "final"]
    target = parse_spec(spec.read_text()).measure.noise_target
    widths = [
        (w.speedup_hi - w.speedup_lo) / w.speedup
        for w in select_winners(rows)
        if w.speedup and w.speedup_hi is not None and w.speedup_lo is not None
    ]
    return {
        "threads": threads,
        "wall_s": round(wall, 1),
        "rows": len(rows),
        "rows_slowest_over_10x_median": sum(_known(r.max_us) > 10 * _known(r.median_us) for r in rows),
        "rows_noise_median": round(statistics.median(_known(r.rel_noise) for r in rows), 3),
        "finals": len(finals),
        "finals_over_noise_target": sum(_known(r.rel_noise) > target for r in finals),
        "noisiest_final": round(max((_known(r.rel_noise) for r in finals), default=0.0), 3),
        "ci_width_over_speedup_median": round(statistics.median(widths), 3) if widths else None,
        "winners": sorted(f"{dict(w.shape)} {dict(w.config)}" for w in select_winners(rows)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "configs" / "quickstart.toml")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    text = args.spec.read_text()
    runs = []
    for _ in range(args.runs):
        for threads in sorted({cores, max(1, cores - 1)}, reverse=True):
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(one_run(text, threads, Path(tmp)))
                print(json.dumps({k: v for k, v in runs[-1].items() if k != "winners"}), flush=True)
    doc = {"cores": cores, "spec": str(args.spec), "runs": runs}
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
