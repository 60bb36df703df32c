"""Looks not taken (``[search] skip_dominated``), replayed on recorded runs: what would have been left
out, what those looks cost, and whether any could have won.

    python benchmarks/studies/dominated_replay.py RUN_DIR [RUN_DIR ...] [--factor 2.0] [--json OUT]

Each ``RUN_DIR`` is a run's results directory (``.../task=TASK/run_id=RUN``, its Parquet parts). The
points are taken in the order their first looks started, and at each the rule of
``tunectl.decide.dominated`` (the same class the search uses) is asked about the point's first looks,
knowing only the first looks near it that had finished by then. Per run: the first looks, those the
rule leaves out, the seconds their rows took (loading, set-up and measuring: what the worker would not
have spent), the nearest any of them came to its own point's fastest first look, and how many were
within 1 % of their point's winner in the finals (0: no decision would have changed).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tunectl.core.keys import Key
from tunectl.core.record import Phase, Record
from tunectl.decide.dominated import Dominance
from tunectl.decide.points import Point
from tunectl.store.results import read_results


def rows_of(run_dir: Path) -> list[Record]:
    """The records of the run stored at ``run_dir`` (``RESULTS/task=TASK/run_id=RUN``)."""
    return list(read_results(run_dir.parent.parent, [run_dir.name.removeprefix("run_id=")]))


def replay(records: Sequence[Record], factor: float) -> dict[str, Any]:
    """The rule asked at each point as its first looks began (module doc)."""
    first = [r for r in records if r.phase == Phase.SCREEN and r.rung == 0]
    by_point: dict[tuple[Key, Key], list[Record]] = {}
    for r in first:
        by_point.setdefault((r.static, r.shape), []).append(r)
    began = {at: min(r.started_at for r in rows) for at, rows in by_point.items()}
    finals = _finals(records)
    left_out, seconds, nearest, winners = 0, 0.0, math.inf, 0
    for at in sorted(by_point, key=began.__getitem__):
        rule = Dominance(factor)
        for other, rows in by_point.items():
            if other != at and other[0] == at[0]:
                rule.add(_point(other, [r for r in rows if r.finished_at < began[at]]))
        rows = {r.config: r for r in by_point[at]}
        default = next((r.config for r in rows.values() if r.is_default), None)
        here = Point(at[0], at[1], (default, *(c for c in rows if c != default)) if default else tuple(rows))
        rule.add(here)
        fastest = min((r.median_us for r in rows.values() if r.ok and r.median_us), default=None)
        for config in rule.why(here, list(rows)):
            row = rows[config]
            left_out += 1
            seconds += sum((v or 0.0) for v in (row.compile_ms, row.setup_ms, row.measure_ms)) / 1e3
            if fastest and row.ok and row.median_us:
                nearest = min(nearest, row.median_us / fastest)
            winners += config in finals.get(at, ())
    return {
        "first looks": len(first),
        "left out": left_out,
        "share": round(left_out / len(first), 3) if first else 0.0,
        "their rows' seconds": round(seconds, 1),
        "nearest to its point's fastest": None if math.isinf(nearest) else round(nearest, 3),
        "within 1 % of the point's winner in the finals": winners,
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
    args = parser.parse_args(argv)
    doc = {str(run): replay(rows_of(run), args.factor) for run in args.runs}
    text = json.dumps(doc, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
