"""What a bundle confirmed by cell still loses at held-out shapes, and where each loss comes from.

    PYTHONPATH=. python benchmarks/studies/holdout_losses.py --results /tmp/holdout-results \
        --confirm 128=/tmp/holdout-results/confirm-2026-12-05c/confirm-p128.json \
        --confirm 16=/tmp/holdout-results/confirm-2026-12-05d/confirm-p16.json \
        [--runs /tmp/holdout-results/confirm-runs.txt] [--json benchmarks/results/holdout.json --key KEY]

(after ``bash benchmarks/gpu/holdout_h200.sh restore``). ``--confirm PAGE=FILE``: what ``confirm_holdout.py``
wrote for a page (``holdout_h200.sh confirm``): per seed, batch size and KV cell, each candidate's
reading at the cell's edges, from which the cell's one pick (the rule that reproduces the recorded
"one per cell" figures) is taken again. ``--runs``: the bundle and holdout
run of each (page, seed), as ``holdout_h200.sh`` lists them. Runs on CPU; no measuring.

Each held-out shape's loss, confirmed / oracle (the held-out run's fastest config), is the product of

- *the list*: the best of the cell's candidates at the shape over the oracle, what no choice among
  the candidates wins back (a config the list lacks), and
- *the edges*: what confirming installed over the list's best at the shape, what choosing at the
  cell's two edges costs at the lengths between them (with the difference between the confirming
  process's readings and the held-out run's).

Printed per page and pooled over the pages given: both factors (geometric means, shares within 3 %,
worst), the shapes losing more than 3 % with the factor behind each, and how the list's best read
against what the cell served at its edges. ``--json``: the figures under ``--key``, other keys kept.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import re
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.studies.holdout_json import holdout_of
from tunectl.core.keys import Key, make_key
from tunectl.core.spec import DEFAULT_MARGIN
from tunectl.measure.confirm import installed
from tunectl.store.stores import read_bundle

LOSS = 1.03  # a shape loses past 3 %, as the target counts it
_LINE = re.compile(r"^seed (\d+): (.*?) \(for its kv_len cell, timed at (.*?)\): \w+.*?(\{[^{}]*\})(.*)$")
_READING = re.compile(r"(\{[^{}]*\}) (failed|[\d.]+ µs)")


@dataclass(frozen=True)
class Cell:
    """What confirming did for one KV cell at one batch size: the bundle's pick, each candidate's
    reading over the cell's edges (µs: the geometric mean of its medians there; None where it failed),
    in the order confirming timed them, the pick first; none where it ran out of budget first."""

    pick: dict[str, Any]
    edges: tuple[int, ...]
    timed: tuple[tuple[dict[str, Any], float | None], ...]

    @property
    def config(self) -> dict[str, Any]:
        """What the cell serves: the fastest candidate where it beats the pick beyond the margin (one
        pick per cell, ``confirm_holdout.py``'s second rule), else the pick."""
        return dict(installed(list(self.timed), DEFAULT_MARGIN)) if self.timed else self.pick

    @property
    def readings(self) -> dict[Key, float]:
        return {make_key(c): t for c, t in self.timed if t is not None}

    def holds(self, kv_len: int) -> bool:
        """Whether a KV length falls in this cell (``ceil`` buckets: above its lower edge, to its upper)."""
        return kv_len <= self.edges[0] if len(self.edges) == 1 else self.edges[0] < kv_len <= self.edges[1]


def confirmed_cells(path: Path, page: str) -> dict[tuple[int, int], list[Cell]]:
    """Per (seed, batch): the cells confirming went through, from a ``confirm_holdout.py`` file."""
    out: dict[tuple[int, int], list[Cell]] = {}
    for line in json.loads(path.read_text())["page"][page]["shapes"]:
        found = _LINE.match(line)
        if found is None:
            continue
        seed, shape_text, timed_at, config, rest = found.groups()
        batch = int(dict(p.split("=") for p in shape_text.split(", "))["batch"])
        edges = tuple(int(e) for e in re.findall(r"kv_len=(\d+)", timed_at))
        timed = tuple(
            (ast.literal_eval(c), None if t == "failed" else float(t.split()[0]))
            for c, t in _READING.findall(rest)
        )
        pick = timed[0][0] if timed else ast.literal_eval(config)
        out.setdefault((int(seed), batch), []).append(Cell(pick, edges, timed))
    return out


def shape_losses(
    results: Path, runs: Sequence[tuple[int, str, str]], cells: Mapping[tuple[int, int], list[Cell]]
) -> list[dict]:
    """One row per held-out shape confirming answered: its ratios, and the factors of the confirmed one."""
    rows = []
    for seed, bundle_dir, run in runs:
        bundle = read_bundle(bundle_dir)
        for h in holdout_of(results, bundle_dir, run, DEFAULT_MARGIN).shapes:
            shape = dict(h.shape)
            batch, kv_len = int(str(shape["batch"])), int(str(shape["kv_len"]))
            cell = next((c for c in cells.get((seed, batch), []) if c.holds(kv_len)), None)
            if h.ratio is None or cell is None:
                continue
            listed = [
                make_key(c) for c in bundle.candidates("flash_decode", **dict(h.static), **dict(h.shape))
            ]
            timed = [k for k in listed if k in h.losses]
            best = min(timed, key=h.losses.__getitem__)
            mine, edges = make_key(cell.config), cell.readings
            if mine not in h.losses:
                continue
            rows.append(
                {
                    "seed": seed,
                    "shape": shape,
                    "cell": list(cell.edges),
                    "pick": h.ratio,
                    "confirmed": h.losses[mine],
                    "list": h.losses[best],
                    "edges": h.losses[mine] / h.losses[best],
                    "listed": len(listed),
                    "chose": dict(mine),
                    "list_best": dict(best),
                    "oracle": dict(h.oracle or ()),
                    # the list's best over what confirming chose, as read at the cell's edges
                    "edges_read": edges[best] / edges[mine] if best in edges and mine in edges else None,
                }
            )
    return rows


def geomean(xs: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else math.nan


def report(title: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Print the page's table and its losing shapes; the figures, for ``--json``."""
    figures = {
        way: {
            "geomean": round(geomean([r[way] for r in rows]), 4),
            "within_3pct": round(sum(r[way] <= LOSS for r in rows) / len(rows), 4),
            "worst": round(max(r[way] for r in rows), 4),
        }
        for way in ("pick", "confirmed", "list", "edges")
    }
    print(f"\n## {title}: {len(rows)} held-out shapes\n")
    print("| factor | geomean | within 3 % | worst |\n|---|---|---|---|")
    for way, f in figures.items():
        print(f"| {way} | {f['geomean']:.4f} | {f['within_3pct']:.0%} | {f['worst']:.3f} |")
    losing = [r for r in rows if r["confirmed"] > LOSS]
    print(f"\n{len(losing)} shapes lose more than 3 % confirmed:\n")
    for r in sorted(losing, key=lambda r: -r["confirmed"]):
        why = "the list" if r["list"] > LOSS else "the edges" if r["edges"] > LOSS else "both, each under 3 %"
        why += f"; the oracle {r['oracle']}" if r["list"] > 1.0 else ""
        read = (
            "" if r["edges_read"] is None else f"; at the edges the list's best read {r['edges_read']:.3f}x"
        )
        print(
            f"- seed {r['seed']} {r['shape']}: confirmed {r['confirmed']:.3f} = list {r['list']:.3f} x edges "
            f"{r['edges']:.3f} ({why}); cell {r['cell']}, served {r['chose']}, "
            f"the list's best {r['list_best']}{read}"
        )
    return {**figures, "shapes": len(rows), "losing": losing}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--confirm", action="append", required=True, help="PAGE=a confirm_holdout.py file")
    parser.add_argument(
        "--runs", type=Path, help="PAGE SEED BUNDLE_DIR RUN lines (default: RESULTS/confirm-runs.txt)"
    )
    parser.add_argument("--json", type=Path, help="write the figures here, under the key --key")
    parser.add_argument("--key", default="losses")
    args = parser.parse_args(argv)
    listed = [
        line.split() for line in (args.runs or args.results / "confirm-runs.txt").read_text().splitlines()
    ]
    doc: dict[str, Any] = {}
    every: list[dict[str, Any]] = []
    for given in args.confirm:
        page, _, path = given.partition("=")
        cells = confirmed_cells(Path(path), page)
        seeds = {seed for seed, _ in cells}
        runs = [
            (int(seed), bundle, run) for p, seed, bundle, run in listed if p == page and int(seed) in seeds
        ]
        rows = shape_losses(args.results, runs, cells)
        doc[page] = report(f"page {page}", rows)
        every += rows
    if len(args.confirm) > 1:
        doc["pooled"] = report("both pages", every)
    if args.json:
        kept = json.loads(args.json.read_text()) if args.json.exists() else {}
        args.json.write_text(json.dumps({**kept, args.key: doc}, indent=1) + "\n")  # the file's order kept


if __name__ == "__main__":
    main()
