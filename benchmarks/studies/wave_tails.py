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
two waves or more and a fill below ``--fill``, the list's first config that splits instead. With
``--run`` (the bundle's tuning run), two choices among the list made from that run's own readings
(finals and probes) are replayed too: each config's reading at the entry's point scaled by how much
fuller its waves run at the held-out batch; and the least geometric mean over the entry's point and
the compared KV length below it at the same batch (the cell's two edges as tuned). Each replaces the
bundle's pick only beyond the export margin. No GPU; the records from ``bash
benchmarks/gpu/holdout_h200.sh restore``::

    PYTHONPATH=. python benchmarks/studies/wave_tails.py --results /tmp/holdout-results --page 128 \
        --bundle /tmp/holdout-results/bundles/h200-rules-p128/3 --seeds 101-115 --run r20261204-030703-b25d80
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.studies.holdout_json import figures, holdout_of, size_of
from tunectl import api
from tunectl.core.keys import Key, Value, key_text, make_key
from tunectl.core.record import Phase
from tunectl.core.spec import DEFAULT_MARGIN
from tunectl.decide.holdout import HeldOut, Standing
from tunectl.decide.select import latest_comparisons
from tunectl.runtime import Entry
from tunectl.store.results import read_results

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
        waves, f = fill(size_of(dict(h.shape)["batch"]), heads)
        split = [v for c, v in h.losses.items() if splits(c)]
        for unsplit in UNSPLIT:
            if waves >= 2 and unsplit in h.losses and split:
                out.append((unsplit, f, h.losses[unsplit] / min(split)))
    return out


Choose = Callable[[HeldOut, Entry, list[Key]], Key | None]


def replayed(held: Sequence[HeldOut], bundle: api.Bundle, task: str, choose: Choose) -> dict[str, Any]:
    """The figures of the picks ``choose`` makes (None: the bundle's) at each compared shape."""
    ratios = []
    for h in held:
        if h.ratio is None:
            continue
        params = {**dict(h.static), **dict(h.shape)}
        entry = bundle.entry(task, **params)
        listed = [make_key(c) for c in bundle.candidates(task, **params)]
        pick = (choose(h, entry, listed) if entry is not None else None) or h.pick
        ratios.append(h.losses.get(pick, h.ratio))
    return figures(Standing("replayed", tuple(ratios)))


def guard(heads: int, below: float) -> Choose:
    """The list's first splitting config where flash-attn-4's default would run a part-filled wave."""

    def choose(h: HeldOut, entry: Entry, listed: list[Key]) -> Key | None:
        waves, f = fill(size_of(dict(h.shape)["batch"]), heads)
        if h.pick == UNSPLIT[0] and waves >= 2 and f < below:
            return next((c for c in listed if splits(c) and c in h.losses), None)
        return None

    return choose


Readings = dict[tuple[Key, int, int], dict[str, float]]  # (static, batch, kv_len) -> config text -> µs


def readings(results: Path, run_id: str) -> Readings:
    """The tuning run's comparisons (finals and probes), each config's mean there."""
    records = list(read_results(results, [run_id]))
    out: Readings = {}
    for phase in (Phase.FINAL, Phase.PROBE):
        for arms in latest_comparisons(records, phase).values():
            for r in arms:
                if r.status == "ok" and r.mean_us:
                    shape = dict(r.shape)
                    at = out.setdefault((r.static, size_of(shape["batch"]), size_of(shape["kv_len"])), {})
                    at.setdefault(r.config_key, r.mean_us)
    return out


def _least(scores: dict[Key, float], first: Key) -> Key | None:
    """The least-scored config where it beats ``first`` by more than the export margin."""
    if first not in scores:
        return None
    best = min(scores, key=scores.__getitem__)
    return best if scores[first] > scores[best] * (1 + DEFAULT_MARGIN) else None


def at_point_by_waves(read: Readings, heads: int) -> Choose:
    """Each listed config's reading at the entry's point, scaled by how much fuller or emptier its
    waves run at the held-out batch than there (a fixed split count's units: batch x heads x count)."""

    def units(config: Key, batch: int) -> float:
        c = dict(config)
        counts: dict[Value, Value] = {"fa4": c.get("num_splits", 1), "triton": c.get("num_kv_splits", 0)}
        count = counts.get(c.get("backend"), 0)
        return fill(batch * size_of(count), heads)[1] if count else 1.0

    def choose(h: HeldOut, entry: Entry, listed: list[Key]) -> Key | None:
        shape = dict(entry.shape)
        at = read.get((entry.static, size_of(shape["batch"]), size_of(shape["kv_len"])), {})
        tuned, held = size_of(shape["batch"]), size_of(dict(h.shape)["batch"])
        scores = {
            c: at[key_text(c)] * units(c, tuned) / units(c, held)
            for c in listed
            if key_text(c) in at and c in h.losses
        }
        return _least(scores, listed[0])

    return choose


def on_kv_edges(read: Readings) -> Choose:
    """The listed config with the least geometric mean of its losses at the entry's point and at the
    compared KV length below it at the entry's batch (the cell's two edges, as tuned)."""

    def choose(h: HeldOut, entry: Entry, listed: list[Key]) -> Key | None:
        shape = dict(entry.shape)
        batch, kv = size_of(shape["batch"]), size_of(shape["kv_len"])
        below = [k for (st, b, k) in read if st == entry.static and b == batch and k < kv]
        edges = [
            read.get((entry.static, batch, kv), {}),
            read.get((entry.static, batch, max(below, default=0)), {}),
        ]
        if entry.rule is not None or not all(edges):
            return None
        scores = {
            c: math.prod(e[key_text(c)] / min(e.values()) for e in edges)
            for c in listed
            if all(key_text(c) in e for e in edges) and c in h.losses
        }
        return _least(scores, listed[0])

    return choose


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--page", required=True)
    parser.add_argument("--bundle", required=True, help="the bundle whose picks are replayed")
    parser.add_argument("--seeds", default="101-115", help="LOW-HIGH: the held-out runs' seeds")
    parser.add_argument("--fill", type=float, nargs="+", default=[0.8, 0.9, 0.92, 0.95])
    parser.add_argument("--run", help="the bundle's tuning run: also replay choices made from its readings")
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
    heads = size_of(dict(next(iter(bundle.entries(args.task))).static)["num_kv_heads"])
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
        "guarded": {f"fill < {b:g}": replayed(held, bundle, args.task, guard(heads, b)) for b in args.fill},
    }
    if args.run:
        tuned = readings(args.results, args.run)
        doc["chosen at the entry's point, scaled by waves"] = replayed(
            held, bundle, args.task, at_point_by_waves(tuned, heads)
        )
        doc["chosen on the entry's two KV edges"] = replayed(held, bundle, args.task, on_kv_edges(tuned))
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
