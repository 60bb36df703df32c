"""Looks not taken (``[search] skip_dominated``), replayed on recorded runs: what would have been left
out, what those looks cost, and whether any could have won.

    python benchmarks/studies/dominated_replay.py RUN_DIR [RUN_DIR ...] [--factor 2.0] [--json OUT] [--export]

Each ``RUN_DIR`` is a run's results directory (``.../task=TASK/run_id=RUN``, its Parquet parts). The
points are taken in the order their first looks started, and at each the rule of
``tunectl.decide.dominated`` (the same class the search uses, with the run's split parameters) is
asked about the point's first looks, knowing only the first looks near it that had finished by then
and that the rule had not left out itself. Per run: the first looks, those the
rule leaves out, the seconds their rows took (loading, set-up and measuring: what the worker would not
have spent), the nearest any of them came to its own point's fastest first look, and how many were
within 1 % of their point's winner in the finals (0: no decision would have changed). ``--across``
also plays a rule the search does not use, evidence across static keys: a config more than
``factor`` times the fastest at the same shape under another static key of the run (both ways, an
upper bound), with the same figures. ``--export``
also exports a bundle from the run as recorded and one from a copy without the rows of the looks left
out (in a temporary folder), and counts the entries whose config or candidate list differ.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.studies.table_bound import copy_run
from tunectl import api
from tunectl.core.keys import Key
from tunectl.core.record import Phase, Record
from tunectl.decide.dominated import Dominance
from tunectl.decide.points import Point
from tunectl.decide.rules import split_count
from tunectl.store.results import read_results
from tunectl.store.runs import load_run, run_facts


def rows_of(run_dir: Path) -> list[Record]:
    """The records of the run stored at ``run_dir`` (``RESULTS/task=TASK/run_id=RUN``)."""
    return list(read_results(run_dir.parent.parent, [run_dir.name.removeprefix("run_id=")]))


def split_params_of(run_dir: Path) -> tuple[str, ...]:
    """The split-count parameters of the run's task (its plan-time facts)."""
    facts = run_facts(load_run(run_dir.parent.parent, run_dir.name.removeprefix("run_id=")))
    return facts.split_params if facts else ()


def replay(
    records: Sequence[Record], factor: float, split_params: tuple[str, ...] = ()
) -> tuple[dict[str, Any], set[str]]:
    """The rule asked at each point as its first looks began (module doc), a look it left out at a
    point unknown at the points after it; the figures, and the item ids of the looks left out."""
    first = [r for r in records if r.phase == Phase.SCREEN and r.rung == 0]
    by_point: dict[tuple[Key, Key], list[Record]] = {}
    for r in first:
        by_point.setdefault((r.static, r.shape), []).append(r)
    began = {at: min(r.started_at for r in rows) for at, rows in by_point.items()}
    gone: dict[tuple[tuple[Key, Key], Key], Record] = {}  # (point, config) -> the row of a look left out
    for at in sorted(by_point, key=began.__getitem__):
        rule = Dominance(factor, split_params)
        for other, rows in by_point.items():
            if other != at and other[0] == at[0]:
                rule.add(
                    _point(
                        other,
                        [r for r in rows if r.finished_at < began[at] and (other, r.config) not in gone],
                    )
                )
        looks = {r.config: r for r in by_point[at]}
        default = [c for c, r in looks.items() if r.is_default]
        here = Point(at[0], at[1], (*default, *(c for c in looks if c not in default)))
        rule.add(here)
        gone.update({(at, c): looks[c] for c in rule.why(here, list(looks))})
    return _figures(first, gone, _finals(records), by_point), {r.item_id for r in gone.values()}


def _figures(
    first: Sequence[Record],
    gone: dict[tuple[tuple[Key, Key], Key], Record],
    finals: dict[tuple[Key, Key], set[Key]],
    by_point: dict[tuple[Key, Key], list[Record]],
) -> dict[str, Any]:
    fastest = {
        at: min((r.median_us for r in rows if r.ok and r.median_us), default=0.0)
        for at, rows in by_point.items()
    }
    behind = [
        r.median_us / fastest[at] for (at, _), r in gone.items() if r.ok and r.median_us and fastest[at]
    ]
    return {
        "first looks": len(first),
        "left out": len(gone),
        "share": round(len(gone) / len(first), 3) if first else 0.0,
        "their rows' seconds": round(
            sum((v or 0.0) for r in gone.values() for v in (r.compile_ms, r.setup_ms, r.measure_ms)) / 1e3, 1
        ),
        "nearest to its point's fastest": round(min(behind), 3) if behind else None,
        "within 1 % of the point's winner in the finals": sum(c in finals.get(at, ()) for at, c in gone),
    }


def across(records: Sequence[Record], factor: float, split_params: tuple[str, ...] = ()) -> dict[str, Any]:
    """The figures of a rule taking its evidence from the same shape under another static key."""
    first = [r for r in records if r.phase == Phase.SCREEN and r.rung == 0]
    looks: dict[tuple[Key, Key], dict[Key, Record]] = {}
    for r in first:
        if r.ok and not r.drift and r.median_us:
            looks.setdefault((r.static, r.shape), {})[r.config] = r
    gone: dict[tuple[tuple[Key, Key], Key], Record] = {}
    for (static, shape), here in looks.items():
        for (other, where), there in looks.items():
            if where != shape or other == static:
                continue
            fastest = min(r.median_us or 0.0 for r in there.values())
            far = [c for c in here if c in there and (there[c].median_us or 0.0) > factor * fastest]
            far = [
                c for c in far if not here[c].is_default and not any(split_count(c, p) for p in split_params)
            ]
            gone.update({((static, shape), c): here[c] for c in far})
    by_point = {at: list(rows.values()) for at, rows in looks.items()}
    return _figures(first, gone, _finals(records), by_point)


def bundles_apart(run_dir: Path, dropped: set[str]) -> dict[str, int]:
    """Entries whose config, and whose candidate list, differ between a bundle of the run as recorded
    and one of the run without the rows ``dropped``."""
    results, run = run_dir.parent.parent, run_dir.name.removeprefix("run_id=")
    task = run_dir.parent.name.removeprefix("task=")
    gone = pa.array(sorted(dropped), type=pa.string())
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "res"
        copy_run(
            results, run, copy, lambda t: t.filter(pc.invert(pc.is_in(t.column("item_id"), value_set=gone)))
        )
        made = []
        for where, name in ((results, "recorded"), (copy, "less")):
            options = api.ExportOptions(scope=api.Scope(run_ids=[run]))
            done = api.export_bundle(where, name, "1", str(Path(tmp) / "bundles"), options)
            entries = api.read_bundle(done.result.location).entries(task)
            made.append({(e.static, e.shape): e for e in entries})
    recorded, less = made
    apart = [(e, less.get(k)) for k, e in recorded.items()]
    return {
        "entries": len(recorded),
        "configs apart": sum(b is None or b.config != a.config for a, b in apart),
        "lists apart": sum(b is None or b.candidates != a.candidates for a, b in apart),
    }


def _point(at: tuple[Key, Key], rows: Sequence[Record]) -> Point:
    point = Point(at[0], at[1], tuple(dict.fromkeys(r.config for r in rows)))
    point.records.update({r.item_id: r for r in rows})
    return point


def _finals(records: Sequence[Record]) -> dict[tuple[Key, Key], set[Key]]:
    """Per point, the configs within 1 % of the fastest arm of its finals (by paired speedup)."""
    arms: dict[tuple[Key, Key], dict[Key, float]] = {}
    for r in records:
        if r.phase == Phase.FINAL and r.ok:
            arms.setdefault((r.static, r.shape), {})[r.config] = 1.0 if r.is_default else (r.speedup or 0.0)
    return {at: {c for c, s in got.items() if s >= max(got.values()) / 1.01} for at, got in arms.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--export", action="store_true")
    parser.add_argument("--across", action="store_true")
    args = parser.parse_args(argv)
    doc = {}
    for run in args.runs:
        figures, dropped = replay(rows_of(run), args.factor, split_params_of(run))
        doc[str(run)] = {**figures, **({"bundles": bundles_apart(run, dropped)} if args.export else {})}
        if args.across:
            doc[str(run)]["across static keys"] = across(rows_of(run), args.factor, split_params_of(run))
    text = json.dumps(doc, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
