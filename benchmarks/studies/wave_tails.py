"""Wave tails between tuned points: kernels that never split, read from held-out records.

A decode kernel that does not split the KV length launches one unit of work per (sequence, KV
head): flash-attn-4's default (its query heads packed per KV head) and FlashInfer's with its
split-KV planning off, ``batch x num_kv_heads`` units if their grids are so laid out. The device
runs ``SMS`` units at once, and a launch of more waits for a part-filled last wave: its fill is
``units / (waves x SMS)``. A grid at powers of two puts every tuned batch of 16 and over near a
whole number of waves (8 KV heads on the H200's 132 SMs: 0.97 at 16, 32, 64 and 128), so a table of
points sees such a kernel at its best and serves it over batches where its last wave is part empty.

Read here, per such kernel, at every held-out shape of two waves or more where the held-out run
timed it: its time over the fastest config that splits (FlexAttention, FlashInfer with its
planning, Triton with a rule or its heuristic), by fill. Then the bundle's picks replayed with a
guard: where the pick is flash-attn-4's default (the kernel whose reading falls with its fill), at
two waves or more and a fill below ``--fill``, the list's first config that splits instead. No GPU;
the records from ``bash benchmarks/gpu/holdout_h200.sh restore``::

    PYTHONPATH=. python benchmarks/studies/wave_tails.py --results /tmp/holdout-results --page 128 \
        --bundle /tmp/holdout-results/bundles/h200-rules-p128/3 --seeds 101-115
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
from tunectl.core.keys import Key, key_text, make_key
from tunectl.core.spec import DEFAULT_MARGIN
from tunectl.decide.holdout import HeldOut, Standing

SMS = 132  # the H200's SMs
#: kernels that never split: flash-attn-4's default (GQA packed per KV head) and FlashInfer's with
#: its split-KV planning off
UNSPLIT = (
    make_key({"backend": "fa4"}),
    make_key({"backend": "flashinfer", "disable_split_kv": True, "use_tensor_cores": True}),
)
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


def tails(held: Sequence[HeldOut], heads: int) -> list[tuple[Key, float, float]]:
    """(kernel, fill, its time over the fastest splitting config's) for each kernel that never splits,
    at two waves or more."""
    out = []
    for h in held:
        waves, f = fill(int(dict(h.shape)["batch"]), heads)
        split = [v for c, v in h.losses.items() if splits(c)]
        for unsplit in UNSPLIT:
            if waves >= 2 and unsplit in h.losses and split:
                out.append((unsplit, f, h.losses[unsplit] / min(split)))
    return out


def guarded(held: Sequence[HeldOut], bundle: api.Bundle, task: str, heads: int, below: float) -> list[float]:
    """Pick / oracle with the guard (module doc) at each compared shape."""
    ratios = []
    for h in held:
        if h.ratio is None:
            continue
        pick = h.pick
        waves, f = fill(int(dict(h.shape)["batch"]), heads)
        if pick == UNSPLIT[0] and waves >= 2 and f < below:
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
    bins: dict[str, dict[str, list[float]]] = {}
    for kernel, f, r in read:
        low = math.floor(f * 10) / 10
        bins.setdefault(key_text(kernel), {}).setdefault(f"{low:.1f}-{low + 0.1:.1f}", []).append(r)
    doc: dict[str, Any] = {
        "seeds": sorted(runs),
        "over the fastest split, by fill (median, shapes)": {
            kernel: {k: [round(statistics.median(v), 3), len(v)] for k, v in sorted(by.items())}
            for kernel, by in bins.items()
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
