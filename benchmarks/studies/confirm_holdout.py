"""Picks confirmed at start-up, scored at held-out shapes: what a serving process that times its
bundle's candidates (``tunectl bundle confirm``, ``api.confirm_candidates``) would run there, against
the oracle of a held-out run of the same session. Needs the task's device (the H200 for decode).

    python benchmarks/studies/confirm_holdout.py --results RESULTS \
        --holdout 128:104=BUNDLE_DIR:HOLDOUT_RUN [--holdout ...] --json OUT.json [--budget-s 120] \
        [--time-batches 32 --kv-len 4096]

Each ``--holdout PAGE:SEED=BUNDLE_DIR:RUN`` names a bundle exported with candidates and the run
``tunectl validate BUNDLE --holdout N --seed SEED`` recorded for it (every selectable config timed at
each held-out shape). Per run, the candidates are confirmed as a serving process would at start-up:
at that run's batch sizes, but not at its KV lengths, which a serving process cannot know in advance
(``--by-cell kv_len``, the default: each KV cell of the bundle is confirmed at its edges, and the
pick serves the cell); ``--by-cell ''`` confirms at the held-out shapes themselves, an upper bound
no serving process reaches. Timed again here, independently of the run; what the confirmed bundle
answers at each held-out shape is scored with the run's records exactly as ``holdout_json.py`` scores
the bundle's own picks; pooled per page, beside the bundle's picks. The seconds confirming took are
recorded per run. ``--time-batches N``: also time confirming at N batch sizes spread over the
bundle's batch span (a serving process's captured sizes), over every KV cell (at ``--kv-len`` where
``--by-cell ''``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.studies.holdout_json import figures, holdout_of, pooled
from tunectl import api
from tunectl.core.keys import make_key
from tunectl.core.spec import DEFAULT_MARGIN
from tunectl.decide.holdout import HeldOut, Holdout
from tunectl.measure.confirm import cell_grid, installed


def confirmed_holdout(
    held: Holdout, bundle: api.Bundle, task: str, options: api.ConfirmOptions, by_cell: Sequence[str] = ()
) -> tuple[dict[str, Holdout], float, list[str]]:
    """``held`` with each shape's pick replaced by what the bundle answers there once its candidates
    are confirmed, under each rule for a cell (``RULES``: the same timings, judged two ways); the
    seconds it took, and a line per shape confirmed. ``by_cell``: the dimensions a serving process
    cannot know (the KV length), left out of the shapes confirmed at, so they are confirmed cell by
    cell and never at the held-out values; none: at the held-out shapes themselves."""
    picks: dict[str, dict[tuple[Any, Any], Any]] = {rule: {} for rule in RULES}
    lines: list[str] = []
    seconds = 0.0
    for static in {h.static for h in held.shapes}:
        mine = [dict(h.shape) for h in held.shapes if h.static == static]
        known = [{k: v for k, v in shape.items() if k not in by_cell} for shape in mine]
        asked = [dict(s) for s in sorted({tuple(sorted(s.items())) for s in known})]
        mine_options = dataclasses.replace(options, static=dict(static))
        done = api.confirm_candidates(bundle, task, asked, mine_options)
        seconds += done.seconds
        lines += [f"timed as {done.how}", *(report.line() for report in done.reports)]
        for rule, served_by in RULES.items():
            answering = served_by(done, bundle, task, asked, options)
            for shape in mine:
                served = answering.lookup(task, **dict(static), **shape)
                if served is not None and served != bundle.lookup(task, **dict(static), **shape):
                    picks[rule][(static, make_key(shape))] = make_key(served)
    swapped = {
        rule: Holdout(
            tuple(_picking(h, mine.get((h.static, h.shape), h.pick)) for h in held.shapes),
            held.margin,
            held.baselines,
        )
        for rule, mine in picks.items()
    }
    return swapped, seconds, lines


def _whole_cells(
    done: api.Confirmed,
    bundle: api.Bundle,
    task: str,
    asked: Sequence[dict[str, Any]],
    options: api.ConfirmOptions,
) -> api.Bundle:
    """What the rule before parts installs from the same timings: per cell, the candidate with the
    least geometric mean of its medians at the cell's edges (the reports' ``timed``), serving the
    whole cell."""
    picks = [
        ({**done.static, **r.shape}, installed(r.timed, options.margin))
        for r in done.reports
        if r.timed and installed(r.timed, options.margin) != r.timed[0][0]
    ]
    grid = cell_grid(bundle, task, asked, options.cell_span)
    return bundle.with_confirmed(task, picks, by_cell=grid) if picks else bundle


#: how a cell's timings are judged: by part on the lines between its edges (what confirming installs,
#: ``tunectl.measure.parts``), and the rule before it, one pick per cell by the edges' geometric mean
RULES = {
    "confirmed picks": lambda done, *_: done.bundle,
    "confirmed picks, one per cell (geometric mean of the edges)": _whole_cells,
}


def _picking(held: HeldOut, pick: Any) -> HeldOut:
    """``held`` as if ``pick`` had been served there: its time over the oracle's, from the same arms."""
    return dataclasses.replace(
        held, pick=pick, ratio=held.losses.get(pick) if held.ratio is not None else None
    )


def unscored(held: Sequence[Holdout]) -> int:
    """Shapes whose confirmed pick has no time of its own in the held-out run (a config the run did not
    time, such as a split count a rule gave at that shape): left out of the figures, so counted here."""
    return sum(1 for one in held for h in one.shapes if h.ratio is None and h.status == "ok")


def batch_sizes(bundle: api.Bundle, task: str, n: int) -> list[int]:
    """``n`` batch sizes spread evenly over the batches the bundle's entries span."""
    batches = sorted({int(str(dict(e.shape)["batch"])) for e in bundle.entries(task)})
    low, high = batches[0], batches[-1]
    return sorted({round(low + (high - low) * i / max(1, n - 1)) for i in range(n)})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--holdout", action="append", required=True, help="PAGE:SEED=BUNDLE_DIR:HOLDOUT_RUN")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--task", default="flash_decode")
    parser.add_argument("--budget-s", type=float, default=120.0)
    parser.add_argument("--time-batches", type=int, default=0)
    parser.add_argument("--batch-budget-s", type=float, default=1e9, help="the budget of --time-batches")
    parser.add_argument("--kv-len", type=int, default=4096)
    parser.add_argument("--cell-span", type=float, default=api.CELL_SPAN)
    parser.add_argument(
        "--by-cell",
        default="kv_len",
        help="dimensions confirmed cell by cell, not at the held-out values (comma-separated; '' for none)",
    )
    args = parser.parse_args(argv)
    pages: dict[str, dict[str, Any]] = {}
    for spec in args.holdout:
        where, _, rest = spec.partition("=")
        page, _, seed = where.partition(":")
        bundle_dir, _, run_id = rest.rpartition(":")
        bundle = api.read_bundle(bundle_dir)
        held = holdout_of(args.results, bundle_dir, run_id, DEFAULT_MARGIN)
        by_cell = [d for d in args.by_cell.split(",") if d]
        options = api.ConfirmOptions(budget_s=args.budget_s, cell_span=args.cell_span)
        confirmed, seconds, lines = confirmed_holdout(held, bundle, args.task, options, by_cell)
        one = pages.setdefault(
            page, {"picks": [], **{rule: [] for rule in RULES}, "seeds": [], "confirm_s": [], "lines": []}
        )
        one["lines"] += [f"seed {seed}: {line}" for line in lines]
        one["picks"].append(held)
        for rule, scored in confirmed.items():
            one[rule].append(scored)
        one["seeds"].append(int(seed))
        one["confirm_s"].append(round(seconds, 2))
        one["bundle"] = bundle_dir
        print(f"page {page} seed {seed}: confirmed in {seconds:.1f} s", flush=True)
        _write(args.json, _document(pages, args))  # after each run: a stop later keeps what was done
    doc = _document(pages, args)
    for page, one in pages.items():
        if args.time_batches:
            doc["page"][page]["confirm at batch sizes"] = _at_batch_sizes(one["bundle"], args)
            _write(args.json, doc)
    print(json.dumps(doc, sort_keys=True))


def _document(pages: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The figures of the runs confirmed so far, per page."""
    doc: dict[str, Any] = {"page": {}}
    for page, one in pages.items():
        doc["page"][page] = {
            "bundle's picks": figures(pooled(one["picks"]).standings()[0]),
            **{rule: figures(pooled(one[rule]).standings()[0]) for rule in RULES},
            "confirmed picks the held-out runs did not time": unscored(one["confirmed picks"]),
            "seeds": one["seeds"],
            "confirm_s per run": one["confirm_s"],
            "confirmed by cell along": args.by_cell or "nothing (at the held-out shapes)",
            "cell span": args.cell_span if args.by_cell else None,
            "budget_s per run": args.budget_s,
            "shapes": one["lines"],
        }
    return doc


def _at_batch_sizes(bundle_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    """Confirming timed at ``--time-batches`` batch sizes over the bundle's batch span, within
    ``--batch-budget-s``: what a serving process that captures graphs at them would spend."""
    bundle = api.read_bundle(bundle_dir)
    static = dict(next(iter(bundle.entries(args.task))).static)
    sizes = batch_sizes(bundle, args.task, args.time_batches)
    every_cell = "kv_len" in args.by_cell.split(",")
    known = {"q_len": 1, **({} if every_cell else {"kv_len": args.kv_len})}
    dims = bundle.task_info(args.task)["shape_params"]
    shapes = [{"batch": b, **{k: v for k, v in known.items() if k in dims}} for b in sizes]
    options = api.ConfirmOptions(static=static, budget_s=args.batch_budget_s, cell_span=args.cell_span)
    done = api.confirm_candidates(bundle, args.task, shapes, options)
    return {
        "batches": sizes,
        "kv_len": "every cell" if every_cell else args.kv_len,
        "budget_s": args.batch_budget_s,
        "seconds": round(done.seconds, 2),
        "timed": sum(1 for r in done.reports if r.timed),
        "skipped (budget spent)": sum(1 for r in done.reports if r.skipped),
        "lines": [r.line() for r in done.reports],
    }


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
