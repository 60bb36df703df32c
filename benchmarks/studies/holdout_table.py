"""Held-out shapes, bundle against bundle: pick / oracle per shape, side by side, from recorded runs.

    PYTHONPATH=. python benchmarks/studies/holdout_table.py --results RESULTS \
        --holdout LABEL=BUNDLE_DIR:HOLDOUT_RUN [--holdout ...] [--tuning LABEL=RUN ...] [--margin 0.02]

Each ``--holdout`` names a bundle and the run ``tunectl validate BUNDLE --holdout N`` recorded for it;
the table reads that run's records again (no measuring): the shapes it measured, the pick the bundle
serves at each (looked up as the validation did, under the run's own spec), and pick / oracle from
its interleaved comparison. A shape the bundle's own source runs measured (a tuned point, a probe)
is left out, as ``validate --holdout`` leaves it out when it draws. ``--pool`` adds one row per
bundle over every holdout run it was scored on (labels ``NAME@...`` pool by NAME: shapes of several
seeds together); ``--common`` pools again over only the shapes where every bundle's pick was timed
(a split rule's count that the holdout run did not time is missing for that bundle alone) and gives
each geomean against the first's. ``--tuning`` adds what each bundle's tuning run cost (its records and
points, and the span from its first item's start to its last's finish). Prints Markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.studies.h200_archive import require
from tunectl.api.checks import measured_shapes
from tunectl.core.keys import Key, key_dict, key_text
from tunectl.core.record import Phase, Record
from tunectl.core.registry import get_task
from tunectl.core.spec import DEFAULT_MARGIN, parse_spec
from tunectl.decide.holdout import HeldOut, Holdout, plan_holdout, read_holdout
from tunectl.store.results import read_results
from tunectl.store.runs import load_run
from tunectl.store.stores import read_bundle


def holdout_of(results: Path, bundle_dir: str, run_id: str, margin: float) -> Holdout:
    """The verdicts of a recorded holdout run, with the picks ``bundle_dir`` serves at its shapes."""
    info = load_run(results, run_id)
    spec = parse_spec(info.spec_text, info.spec_path, info.name, stored=True)
    records = [r for r in read_results(results, [run_id]) if r.phase == Phase.HOLDOUT]
    shapes = list(dict.fromkeys(r.shape for r in records))
    bundle = read_bundle(bundle_dir)
    _, picks, _ = plan_holdout(spec, bundle, shapes, rounds=2, task=get_task(spec.task))
    held = read_holdout(records, picks, margin)
    measured = measured_shapes(results, bundle, spec.task)  # not held out for this bundle: left out
    return dataclasses.replace(held, shapes=tuple(h for h in held.shapes if h.shape not in measured))


def cost_of(records: Sequence[Record]) -> str:
    starts = [r.started_at for r in records if r.started_at]
    ends = [r.finished_at for r in records if r.finished_at]
    span = f"{max(ends) - min(starts):.0f} s" if starts and ends else "-"
    points = len({(r.static_key, r.shape_key) for r in records})
    return f"{len(records)} records at {points} points, first start to last finish {span}"


def _shape_text(shape: Key) -> str:
    s = key_dict(shape)
    return " x ".join(str(s[k]) for k in ("batch", "kv_len") if k in s) or key_text(shape)


def table(holdouts: dict[str, Holdout]) -> list[str]:
    labels = list(holdouts)
    rows: dict[str, dict[str, str]] = {}
    for label, held in holdouts.items():
        for h in held.shapes:
            cell = f"{h.ratio:.3f}" if h.ratio is not None else h.status
            if h.ratio is not None and h.loses(held.margin):
                cell = f"**{cell}**"
            rows.setdefault(_shape_text(h.shape), {})[label] = cell
    out = ["| batch x kv_len | " + " | ".join(f"{lab}: pick / oracle" for lab in labels) + " |",
           "|---|" + "---:|" * len(labels)]  # fmt: skip
    for shape, cells in rows.items():
        out.append(f"| {shape} | " + " | ".join(cells.get(lab, "-") for lab in labels) + " |")
    out += ["", "| bundle | shapes compared | median | p95 | worst | geomean | within 3 % | loses > margin |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, held in holdouts.items():
        n = len(held.ratios)
        if not n:
            out.append(f"| {label} | 0 of {len(held.shapes)} | - | - | - | - | - | - |")
            continue
        out.append(
            f"| {label} | {n} of {len(held.shapes)} | {held.quantile(0.5):.3f} | {held.quantile(0.95):.3f} "
            f"| {held.ratios[-1]:.3f} | {held.geomean:.3f} | {sum(r <= 1.03 for r in held.ratios)} of {n} "
            f"| {len(held.losers)} of {n} |"
        )
    return out


def pooled(holdouts: dict[str, Holdout], common: bool = False) -> dict[str, Holdout]:
    """One Holdout per NAME of the labels NAME@..., every shape of its runs together; ``common``: only
    the shapes (of a run labelled @RUN) where every NAME's pick was timed, so the pools compare alike."""
    timed: dict[tuple[str, Key], int] = {}
    for label, held in holdouts.items():
        for h in held.shapes:
            if h.ratio is not None:
                key = (label.partition("@")[2], h.shape)
                timed[key] = timed.get(key, 0) + 1
    names = {label.split("@", 1)[0] for label in holdouts}
    out: dict[str, list[HeldOut]] = {}
    for label, held in holdouts.items():
        run = label.partition("@")[2]
        keep = [h for h in held.shapes if not common or timed.get((run, h.shape)) == len(names)]
        out.setdefault(label.split("@", 1)[0], []).extend(keep)
    margin = next(iter(holdouts.values())).margin
    return {name: Holdout(tuple(shapes), margin) for name, shapes in out.items()}


def common_rows(holdouts: dict[str, Holdout]) -> list[str]:
    """Pooled rows over the shapes where every bundle's pick was timed; each geomean against the first's."""
    pools = pooled(holdouts, common=True)
    means = {name: held.geomean or 1.0 for name, held in pools.items()}
    (first, base), *rest = means.items()
    against = ", ".join(f"{name} {mean - base:+.4f}" for name, mean in rest)
    return ["", *table(pools)[-(2 + len(pools)) :], "", f"geomean against {first} ({base:.4f}): {against}"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--holdout", action="append", required=True, help="LABEL=BUNDLE_DIR:HOLDOUT_RUN")
    parser.add_argument("--tuning", action="append", default=[], help="LABEL=RUN: the bundle's tuning run")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    parser.add_argument("--pool", action="store_true", help="also: each NAME of labels NAME@... pooled")
    parser.add_argument("--common", action="store_true", help="also: pooled where every pick was timed")
    args = parser.parse_args(argv)
    require(args.results)
    holdouts: dict[str, Holdout] = {}
    for spec in args.holdout:
        label, _, rest = spec.partition("=")
        bundle_dir, _, run_id = rest.rpartition(":")
        holdouts[label] = holdout_of(args.results, bundle_dir, run_id, args.margin)
    lines = table(holdouts)
    if args.pool:
        pools = pooled(holdouts)
        lines += ["", *table(pools)[-(2 + len(pools)) :]]
    if args.common:
        lines += ["", "Over the shapes where every bundle's pick was timed:", *common_rows(holdouts)]
    for spec in args.tuning:
        label, _, run_id = spec.partition("=")
        lines.append(f"- {label} (run {run_id}): {cost_of(read_results(args.results, [run_id]))}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
