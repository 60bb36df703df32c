"""How near the oracle can a table of one config per cell come at held-out shapes? Bounds, from records.

    python benchmarks/studies/table_bound.py --results RESULTS \
        --holdout 16:101=BUNDLE_DIR:HOLDOUT_RUN [--holdout ...] [--bundle 16=DIR] [--as-probes]

Each ``--holdout PAGE:SEED=BUNDLE_DIR:RUN`` names a bundle and the run ``tunectl validate BUNDLE
--holdout N --seed SEED`` recorded for it (every selectable config timed at each held-out shape), as in
``holdout_json.py``. Per page, the held-out shapes are grouped by the entry of the page's bundle that
serves them (its cell: the bundle of the page's last run, or ``--bundle PAGE=DIR``), and pooled over
the seeds:

- **the bundle's picks**;
- **one config a cell, knowing the times**: at each cell the config whose geometric-mean loss over the
  cell's held-out shapes is least, chosen with those very times. No table with these cells can do
  better at these shapes (a cell holding one shape gets it right by construction);
- **one family a cell, its best count at each shape**: the same for a kernel family (a config with its
  split count left open), whose fastest count is taken at every shape: a split rule that is never
  wrong, one family a cell;
- **the list's best**: the best of the bundle's candidates (what confirming at start-up can reach).

``--as-probes`` also plays denser probes: the page's runs split by seed into two halves; each half's
held-out comparisons join the bundle's tuning run as probes (a copy of the records in a temporary
results directory, their phase renamed), a bundle is exported from them, and its picks and lists are
scored at the other half's shapes beside the recorded bundle's. Runs on CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.studies.holdout_json import holdout_of
from tunectl import api
from tunectl.core.keys import Key, make_key
from tunectl.core.plan import full_config
from tunectl.core.registry import get_task
from tunectl.core.spec import DEFAULT_MARGIN
from tunectl.decide.holdout import HeldOut
from tunectl.decide.rules import split_count
from tunectl.store.runs import load_run

Run = tuple[str, int, str, str]  # page, seed, bundle directory, holdout run


def figures(ratios: Sequence[float]) -> dict[str, Any]:
    return {
        "geomean": round(statistics.geometric_mean(ratios), 4),
        "within_3pct": f"{sum(r <= 1.03 for r in ratios)} of {len(ratios)}",
        "worst": round(max(ratios), 3),
    }


def family(config: Key, split_params: Sequence[str]) -> Key:
    """``config`` with its split count left open (itself where it sets none)."""
    return make_key({k: v for k, v in config if not (k in split_params and split_count(config, k))})


def best_per_cell(cells: Iterable[list[HeldOut]], group: Callable[[Key], Key]) -> list[float]:
    """Per cell, the group of configs whose geometric-mean loss over the cell's shapes (each shape's
    best member of the group) is least; that group's loss at every shape."""
    out: list[float] = []
    for shapes in cells:
        losses: dict[Key, list[float]] = {}
        for h in shapes:
            best: dict[Key, float] = {}
            for config, loss in h.losses.items():
                g = group(config)
                best[g] = min(loss, best.get(g, math.inf))
            for g, loss in best.items():
                losses.setdefault(g, []).append(loss)
        complete = {g: v for g, v in losses.items() if len(v) == len(shapes)}
        out += min(complete.values(), key=lambda v: sum(map(math.log, v)))
    return out


def standings(bundle: api.Bundle, held: Sequence[HeldOut], task_name: str) -> dict[str, Any]:
    """The picks, the two bounds and the list's best over ``held`` (module doc)."""
    task = get_task(task_name)
    cells: dict[Key, list[HeldOut]] = {}
    picks, lists = [], []
    for h in held:
        params = {**dict(h.static), **dict(h.shape)}
        entry = bundle.entry(task_name, **params)
        if entry is None:
            continue
        cells.setdefault(make_key({"static": entry.static, "shape": entry.shape}), []).append(h)
        pick = full_config(task, dict(bundle.lookup(task_name, **params) or {}))
        if pick in h.losses:
            picks.append(h.losses[pick])
        listed = [full_config(task, dict(c)) for c in bundle.candidates(task_name, **params)]
        if found := [h.losses[c] for c in listed if c in h.losses]:
            lists.append(min(found))
    return {
        "the bundle's picks": figures(picks),
        "one config a cell, knowing the times": figures(best_per_cell(cells.values(), lambda c: c)),
        "one family a cell, its best count at each shape": figures(
            best_per_cell(cells.values(), lambda c: family(c, task.split_params))
        ),
        "the list's best": figures(lists),
        "cells": len(cells),
    }


def copy_run(
    results: Path, run: str, out: Path, change: Callable[[pa.Table], pa.Table] = lambda table: table
) -> None:
    """Run ``run`` of ``results`` copied into the results directory ``out``, each Parquet part through
    ``change``."""
    (out / "_runs").mkdir(parents=True, exist_ok=True)
    shutil.copy(results / "_runs" / f"{run}.json", out / "_runs")
    task = load_run(results, run).task
    src, dst = (d / f"task={task}" / f"run_id={run}" for d in (results, out))
    dst.mkdir(parents=True)
    for part in src.glob("*.parquet"):
        pq.write_table(change(pq.read_table(part)), dst / part.name)


def _as_probe(table: pa.Table) -> pa.Table:
    phase = table.column("phase")
    renamed = pc.if_else(pc.equal(phase, "holdout"), "probe", phase)
    return table.set_column(table.schema.get_field_index("phase"), "phase", renamed)


def as_probes(results: Path, tuning: str, probes: Sequence[str], out: Path) -> api.Bundle:
    """A bundle exported from ``tuning`` with the held-out comparisons of ``probes`` as its probes (the
    records copied into ``out``, their phase renamed)."""
    copy_run(results, tuning, out)
    for run in probes:
        copy_run(results, run, out, _as_probe)
    scope = api.Scope(run_ids=[tuning, *probes])
    done = api.export_bundle(out, "probed", "1", str(out / "bundles"), api.ExportOptions(scope=scope))
    return api.read_bundle(done.result.location)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--holdout", action="append", required=True, help="PAGE:SEED=BUNDLE_DIR:HOLDOUT_RUN")
    parser.add_argument("--task", default="flash_decode")
    parser.add_argument("--bundle", action="append", default=[], help="PAGE=DIR: score this bundle instead")
    parser.add_argument("--as-probes", action="store_true")
    args = parser.parse_args(argv)
    runs: list[Run] = []
    for spec in args.holdout:
        where, _, rest = spec.partition("=")
        page, _, seed = where.partition(":")
        bundle_dir, _, run_id = rest.rpartition(":")
        runs.append((page, int(seed), bundle_dir, run_id))
    held = {run: holdout_of(args.results, run[2], run[3], DEFAULT_MARGIN).shapes for run in runs}
    instead = dict(b.split("=", 1) for b in args.bundle)
    doc: dict[str, Any] = {}
    for page in sorted({r[0] for r in runs}, key=int):
        mine = sorted((r for r in runs if r[0] == page), key=lambda r: r[1])
        bundle = api.read_bundle(instead.get(page, mine[-1][2]))
        doc[page] = standings(bundle, [h for r in mine for h in held[r]], args.task)
        if args.as_probes:
            doc[page]["as probes"] = probed(args, bundle, mine, held)
    print(json.dumps(doc, indent=1))


def probed(
    args: argparse.Namespace, bundle: api.Bundle, runs: Sequence[Run], held: Mapping[Run, Sequence[HeldOut]]
) -> dict[str, Any]:
    """Each half of ``runs`` (by seed) as probes, scored at the other half's shapes (module doc)."""
    tuning = [r for r in bundle.manifest["source_runs"] if load_run(args.results, r).kind == "tune"]
    half = len(runs) // 2
    out = {}
    for probes, scored in ((runs[:half], runs[half:]), (runs[half:], runs[:half])):
        with tempfile.TemporaryDirectory() as tmp:
            made = as_probes(args.results, tuning[0], [r[3] for r in probes], Path(tmp))
            shapes = [h for r in scored for h in held[r]]
            seeds = f"seeds {scored[0][1]}-{scored[-1][1]}"
            out[seeds] = {
                "recorded bundle": standings(bundle, shapes, args.task),
                f"with seeds {probes[0][1]}-{probes[-1][1]} as probes": standings(made, shapes, args.task),
            }
    return out


if __name__ == "__main__":
    main()
