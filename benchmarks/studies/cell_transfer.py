"""Does a choice made at one KV length carry to another at the same batch size? Read from records.

Confirming at start-up by cell (``tunectl.measure.confirm``) times a cell's candidates at its middle and
serves the fastest over the whole cell at that batch size: at most ``sqrt(span)`` away along the KV
length from any shape it serves (span 2: a factor 1.41). How much that costs is read here from a tuning
run's own comparisons (finals and probes: a shape's configs timed in interleaved rounds), at every pair
of shapes of one static key and one batch size whose KV lengths are at most ``--within`` apart: the
config fastest at one, among the configs both compared, timed at the other over the fastest of them
there. Each pair is counted both ways. ``--ends F``: at every shape with a compared shape of the same
batch on either side along the KV length, at most F apart from each other, the config chosen on those
two ends (the least geometric mean of its two times: how confirming judges a cell) and the one chosen
at the nearer end, each timed at the shape between over the fastest there. No GPU::

    bash benchmarks/gpu/holdout_h200.sh restore   # the holdout archives into /tmp/holdout-results
    PYTHONPATH=. python benchmarks/studies/cell_transfer.py --results /tmp/holdout-results \\
        --run 16=r20261204-031233-40eb19 --run 128=r20261204-030703-b25d80 --ends 4
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tunectl.core.record import Phase, Record, Status
from tunectl.store.results import read_results

Place = tuple[str, int, int]  # static key, batch, KV length


def comparisons(records: Iterable[Record]) -> dict[Place, dict[str, float]]:
    """Per shape, each config's median in its comparisons (the least where it was compared twice)."""
    at: dict[Place, dict[str, float]] = defaultdict(dict)
    for r in records:
        if r.status is Status.OK and r.phase in (Phase.FINAL, Phase.PROBE) and r.median_us:
            shape = json.loads(r.shape_key)
            times = at[(r.static_key, int(shape["batch"]), int(shape["kv_len"]))]
            times[r.config_key] = min(r.median_us, times.get(r.config_key, math.inf))
    return at


def losses(at: dict[Place, dict[str, float]], within: float) -> list[float]:
    """For each ordered pair of shapes of one static key and batch at most ``within`` apart along the
    KV length: the time at the second of the config fastest at the first, over the fastest there,
    among the configs both compared (two at least)."""
    out = []
    for (static, batch, kv), here in at.items():
        for (static2, batch2, kv2), there in at.items():
            if (static2, batch2) != (static, batch) or kv2 == kv or max(kv, kv2) > within * min(kv, kv2):
                continue
            common = set(here) & set(there)
            if len(common) >= 2:
                pick = min(common, key=here.__getitem__)
                out.append(there[pick] / min(there[c] for c in common))
    return out


def between(at: dict[Place, dict[str, float]], ends_within: float) -> dict[str, list[float]]:
    """At each shape with compared shapes of its static key and batch on either side (the nearest,
    at most ``ends_within`` apart), among the configs all three compared (two at least): the time of
    the config chosen on both ends (least geometric mean) and of the one chosen at the nearer end,
    over the fastest at the shape."""
    lengths: dict[tuple[str, int], list[int]] = defaultdict(list)
    for static, batch, kv in at:
        lengths[(static, batch)].append(kv)
    out: dict[str, list[float]] = {"both ends": [], "the nearer end": []}
    for (static, batch), kvs in lengths.items():
        kvs.sort()
        for low, kv, high in zip(kvs, kvs[1:], kvs[2:], strict=False):
            ends, here = (at[(static, batch, k)] for k in (low, high)), at[(static, batch, kv)]
            lo, hi = ends
            common = set(lo) & set(hi) & set(here)
            if high > ends_within * low or len(common) < 2:
                continue
            fastest = min(here[c] for c in common)
            nearer = lo if kv * kv <= low * high else hi
            out["both ends"].append(here[min(common, key=lambda c: lo[c] * hi[c])] / fastest)
            out["the nearer end"].append(here[min(common, key=nearer.__getitem__)] / fastest)
    return out


def figures(ratios: Sequence[float], counted: str = "pairs") -> dict[str, Any]:
    if not ratios:
        return {counted: 0}
    return {
        counted: len(ratios),
        "geomean": round(math.exp(math.fsum(map(math.log, ratios)) / len(ratios)), 4),
        "within_3pct": round(sum(r <= 1.03 for r in ratios) / len(ratios), 3),
        "worst": round(max(ratios), 3),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--run", action="append", required=True, help="PAGE=RUN_ID: a tuning run")
    parser.add_argument("--within", type=float, nargs="+", default=[math.sqrt(2), 2.0])
    parser.add_argument("--ends", type=float, default=0.0, help="ends at most this factor apart (0: none)")
    args = parser.parse_args(argv)
    doc: dict[str, Any] = {}
    for spec in args.run:
        page, _, run_id = spec.partition("=")
        at = comparisons(read_results(args.results, [run_id]))
        doc[page] = {"run": run_id, **{f"within {w:.2f}x": figures(losses(at, w)) for w in args.within}}
        if args.ends:
            chosen_on = {k: figures(v, "shapes") for k, v in between(at, args.ends).items()}
            doc[page][f"ends at most {args.ends:g}x apart"] = chosen_on
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
