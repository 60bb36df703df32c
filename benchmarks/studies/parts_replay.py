"""Confirming by cell, judged two ways from one run's lines: each held-out shape's pick by part (the
candidate fastest on the straight line between its medians at the cell's edges, at the part's middle)
and one pick per cell (the least geometric mean of the edges), each scored with the held-out run's
times, shape by shape where they differ.

    python benchmarks/studies/parts_replay.py --confirm confirm-p16.json --page 16 --results RESULTS \
        --holdout 116=BUNDLE_DIR:RUN --holdout 117=... [--holdout ...]

``--confirm``: what ``benchmarks/studies/confirm_holdout.py`` wrote (its ``shapes`` lines name each
cell's parts and every candidate's medians at the edges); ``--holdout SEED=BUNDLE_DIR:RUN``: the
held-out run of that seed (``holdout_json.py``'s). One per cell here takes the least mean, with no
margin for the bundle's own pick, so it can differ from the run's own figure by that margin's keeps.
Runs on CPU.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.studies.holdout_json import holdout_of
from tunectl.core.keys import make_key
from tunectl.core.spec import DEFAULT_MARGIN

_LINE = re.compile(
    r"seed (\d+): batch=(\d+), q_len=\d+, kv_len=\d+ \(for its kv_len cell, timed at kv_len=(\d+)"
    r"(?: and kv_len=(\d+))?\): (.*)"
)
_CANDIDATE = re.compile(r"(\{[^{}]*\}) [\d.]+ µs \(([\d.]+) / ([\d.]+)\)")
_PART = re.compile(r"(\{[^{}]*\}) at kv_len (\d+)-(\d+)")
_CHOSE = re.compile(r"(?:chose|kept the bundle's pick) (\{[^{}]*\})")


def cells_of(lines: Sequence[str]) -> dict[tuple[int, int, int, int], dict[str, Any]]:
    """(seed, batch, low edge, high edge) -> the cell's parts, its candidates' edge medians, its pick."""
    cells = {}
    for line in lines:
        m = _LINE.match(line)
        if m is None or m[4] is None:
            continue  # a cell of one length: no line to read
        decided, _, timed = m[5].partition(" in ")
        cells[(int(m[1]), int(m[2]), int(m[3]), int(m[4]))] = {
            "edges": [(ast.literal_eval(c), float(a), float(b)) for c, a, b in _CANDIDATE.findall(timed)],
            "parts": [(ast.literal_eval(c), int(x), int(y)) for c, x, y in _PART.findall(decided)],
            "chose": ast.literal_eval(chose[1]) if (chose := _CHOSE.match(decided)) else None,
        }
    return cells


def picks(cell: dict[str, Any], kv_len: int) -> tuple[Any, Any]:
    """(by part, one per cell) at ``kv_len``."""
    whole = min(cell["edges"], key=lambda c: c[1] * c[2])[0] if cell["edges"] else cell["chose"]
    part = next((c for c, low, high in cell["parts"] if low <= kv_len <= high), cell["chose"])
    return part, whole


def replay(
    cells: dict[tuple[int, int, int, int], dict[str, Any]], seed: int, held: Any
) -> list[tuple[Any, ...]]:
    """Each held-out shape inside a two-edged cell: (shape, by part, its ratio, one per cell, its ratio)."""
    rows = []
    for shape in held.shapes:
        batch, kv_len = dict(shape.shape)["batch"], dict(shape.shape)["kv_len"]
        cell = next(
            (c for (s, b, lo, hi), c in cells.items() if (s, b) == (seed, batch) and lo < kv_len <= hi), None
        )
        if cell is None:
            continue
        part, whole = picks(cell, kv_len)
        ratios = [shape.losses.get(make_key(p)) for p in (part, whole)]
        rows.append((f"seed {seed}: {batch} x {kv_len}", part, ratios[0], whole, ratios[1]))
    return rows


def summary(ratios: Sequence[float | None]) -> str:
    got = [r for r in ratios if r is not None]
    geomean = math.exp(sum(map(math.log, got)) / len(got)) if got else float("nan")
    within = sum(r <= 1.03 for r in got) / len(got) if got else 0.0
    return f"{geomean:.4f} / {100 * within:.0f} % / {max(got, default=float('nan')):.3f} ({len(got)} shapes)"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--confirm", type=Path, required=True)
    parser.add_argument("--page", required=True)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--holdout", action="append", required=True, help="SEED=BUNDLE_DIR:RUN")
    args = parser.parse_args(argv)
    cells = cells_of(json.loads(args.confirm.read_text())["page"][args.page]["shapes"])
    rows = []
    for spec in args.holdout:
        seed, _, rest = spec.partition("=")
        bundle, _, run = rest.rpartition(":")
        rows += replay(cells, int(seed), holdout_of(args.results, bundle, run, DEFAULT_MARGIN))
    for name, part, by_part, whole, by_cell in rows:
        if by_part != by_cell:
            print(f"{name}: by part {part} {by_part:.3f}; one per cell {whole} {by_cell:.3f}")
    print(f"by part: {summary([r[2] for r in rows])}; one per cell: {summary([r[4] for r in rows])}")


if __name__ == "__main__":
    main()
