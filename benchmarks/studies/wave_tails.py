"""Wave tails between tuned points: a kernel that never splits, read from held-out records.

A decode kernel that does not split the KV length launches one unit of work per (sequence, KV head)
(flash-attn-4's default with its query heads packed per KV head: ``batch x num_kv_heads`` units); the
device runs ``SMS`` of them at once, and a launch of more waits for a second, part-filled wave. Its
fill is ``units / (waves x SMS)``. A tuning grid at powers of two puts every tuned batch of 16 and
over near a whole number of waves (8 KV heads on the H200's 132 SMs: 0.97 at 16, 32, 64 and 128),
so a table of points sees such a kernel at its best and serves it over batches where its last wave
is part empty. Read here, at every held-out shape of two waves or more where the held-out run timed
both, that kernel's time over the fastest config that splits (FlexAttention, FlashInfer, Triton
with a rule), by its fill; then the bundle's picks replayed with a guard: where the pick is that
kernel, at two waves or more, and its fill is below ``--fill``, the list's first config that splits
instead. No GPU; the records from ``bash benchmarks/gpu/holdout_h200.sh restore``::

    PYTHONPATH=. python benchmarks/studies/wave_tails.py --results /tmp/holdout-results --page 128 \
        --bundle /tmp/holdout-results/bundles/h200-rules-p128/3 --seeds 104-115
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from holdout_json import figures, holdout_of

from tunectl import api
from tunectl.core.keys import Key, make_key
from tunectl.core.spec import DEFAULT_MARGIN
from tunectl.decide.holdout import HeldOut, Standing

SMS = 132  # the H200's SMs
UNSPLIT = make_key({"backend": "fa4"})  # flash-attn-4's default: one split, GQA packed per KV head
SPLITS = ("flex", "flashinfer", "triton")


def fill(batch: int, heads: int) -> tuple[int, float]:
    """(waves, fill of the launch) of ``batch x heads`` units on ``SMS``."""
    units = batch * heads
    waves = math.ceil(units / SMS)
    return waves, units / (waves * SMS)


def splits(config: Key) -> bool:
    """A config whose launch follows the shape: a backend that splits by its own plan, or a rule."""
    c = dict(config)
    if c.get("backend") == "flashinfer":
        return not c.get("disable_split_kv", False)
    if c.get("backend") == "triton":
        return "split_rule" in c or c.get("num_kv_splits", 0) == 0
    return c.get("backend") in SPLITS


def tails(held: Sequence[HeldOut], heads: int) -> list[tuple[float, float]]:
    """(fill, the unsplit kernel's time over the fastest splitting config's) at two waves or more."""
    out = []
    for h in held:
        waves, f = fill(int(dict(h.shape)["batch"]), heads)
        split = [v for c, v in h.losses.items() if splits(c)]
        if waves >= 2 and UNSPLIT in h.losses and split:
            out.append((f, h.losses[UNSPLIT] / min(split)))
    return out


def guarded(held: Sequence[HeldOut], bundle: api.Bundle, task: str, heads: int, below: float) -> list[float]:
    """Pick / oracle with the guard (module doc) at each compared shape."""
    ratios = []
    for h in held:
        if h.ratio is None:
            continue
        pick = h.pick
        waves, f = fill(int(dict(h.shape)["batch"]), heads)
        if pick == UNSPLIT and waves >= 2 and f < below:
            listed = [make_key(c) for c in bundle.candidates(task, **dict(h.static), **dict(h.shape))]
            pick = next((c for c in listed if splits(c) and c in h.losses), pick)
        ratios.append(h.losses.get(pick, h.ratio))
    return ratios


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--page", required=True)
    parser.add_argument("--bundle", required=True, help="the bundle whose picks are replayed")
    parser.add_argument("--seeds", default="101-115", help="LOW-HIGH: the held-out runs' seeds")
    parser.add_argument("--fill", type=float, nargs="+", default=[0.8, 0.9, 0.92, 0.95])
    parser.add_argument("--task", default="flash_decode")
    args = parser.parse_args(argv)
    low, _, high = args.seeds.partition("-")
    runs = {}
    for name in ("holdout-runs.txt", "confirm-runs.txt"):
        for line in (args.results / name).read_text().splitlines():
            page, seed, _, run = line.split()
            if page == args.page and int(low) <= int(seed) <= int(high or low):
                runs[int(seed)] = run
    bundle = api.read_bundle(args.bundle)
    heads = int(dict(next(iter(bundle.entries(args.task))).static)["num_kv_heads"])
    held = [
        h for run in runs.values() for h in holdout_of(args.results, args.bundle, run, DEFAULT_MARGIN).shapes
    ]
    read = tails(held, heads)
    bins: dict[str, list[float]] = {}
    for f, r in read:
        bins.setdefault(f"{math.floor(f * 10) / 10:.1f}-{math.floor(f * 10) / 10 + 0.1:.1f}", []).append(r)
    doc: dict[str, Any] = {
        "seeds": sorted(runs),
        "unsplit over the fastest split, by fill (median, shapes)": {
            k: [round(statistics.median(v), 3), len(v)] for k, v in sorted(bins.items())
        },
        "bundle's picks": figures(Standing("pick", tuple(h.ratio for h in held if h.ratio is not None))),
        "guarded": {
            f"fill < {b:g}": figures(Standing("g", tuple(guarded(held, bundle, args.task, heads, b))))
            for b in args.fill
        },
    }
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
