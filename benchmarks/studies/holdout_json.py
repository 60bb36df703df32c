"""Held-out results per page, pooled over seeds, as JSON and a Markdown page (Findings first).

    python benchmarks/studies/holdout_json.py --results RESULTS \
        --holdout 128:11=BUNDLE_DIR:HOLDOUT_RUN --holdout 128:12=... --holdout 16:11=... \
        --json benchmarks/results/holdout.json --markdown benchmarks/results/holdout.md \
        [--commands FILE] [--date 2026-12-10]

Each ``--holdout PAGE:SEED=BUNDLE_DIR:RUN`` names a bundle and the run ``tunectl validate BUNDLE
--holdout N --seed SEED`` recorded for it; the records are read again, no measuring. Per page, every
shape of its runs is pooled: pick / oracle's geometric mean, the share of shapes within 3 %, the worst,
the seeds and the number of shapes; ``baselines`` holds the same for the default, each of the spec's
``[baselines]`` and the best single config. ``--commands``: a file of the commands that made the
records, quoted on the page after the findings. Runs on CPU against any results directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tunectl.api.checks import measured_shapes
from tunectl.core.keys import Value
from tunectl.core.record import Phase
from tunectl.core.registry import get_task
from tunectl.core.spec import DEFAULT_MARGIN, parse_spec
from tunectl.decide.holdout import Holdout, Standing, baselines_of, plan_holdout, read_holdout
from tunectl.store.results import read_results
from tunectl.store.runs import load_run
from tunectl.store.stores import read_bundle

TARGET = {"geomean": 1.005, "within_3pct": 0.95, "worst": 1.10}


def holdout_of(results: Path, bundle_dir: str, run_id: str, margin: float) -> Holdout:
    """A recorded holdout run's verdicts with the picks ``bundle_dir`` serves, shapes it measured left out."""
    info = load_run(results, run_id)
    spec = parse_spec(info.spec_text, info.spec_path, info.name, stored=True)
    task = get_task(spec.task)
    records = [r for r in read_results(results, [run_id]) if r.phase == Phase.HOLDOUT]
    bundle = read_bundle(bundle_dir)
    shapes = list(dict.fromkeys(r.shape for r in records))
    _, picks, _ = plan_holdout(spec, bundle, shapes, rounds=2, task=task)
    held = read_holdout(records, picks, margin, baselines_of(spec, task))
    measured = _measured(results, bundle_dir, spec.task)
    return dataclasses.replace(held, shapes=tuple(h for h in held.shapes if h.shape not in measured))


@functools.cache
def _measured(results: Path, bundle_dir: str, task: str) -> frozenset[Any]:
    """The shapes a bundle was measured at (``measured_shapes``), read once per bundle: every seed's
    run of a page asks for the same bundle's, and its source runs are the largest records here."""
    return frozenset(measured_shapes(results, read_bundle(bundle_dir), task))


def size_of(value: Value) -> int:
    """A size in a key (a batch, a KV length, a head or split count): a whole number."""
    assert isinstance(value, int), value
    return value


def figures(st: Standing) -> dict[str, Any]:
    return {
        "geomean": None if st.geomean is None else round(st.geomean, 4),
        "within_3pct": None if st.within_3pct is None else round(st.within_3pct, 4),
        "worst": None if st.worst is None else round(st.worst, 4),
        "shapes": len(st.ratios),
    }


def pooled(held: Sequence[Holdout]) -> Holdout:
    return Holdout(tuple(h for one in held for h in one.shapes), held[0].margin, held[0].baselines)


def summary(pages: dict[str, list[tuple[int, Holdout]]]) -> dict[str, Any]:
    """The JSON: per page the picks' figures and seeds; per baseline label, its figures per page."""
    out: dict[str, Any] = {"page": {}, "baselines": {}}
    for page, runs in sorted(pages.items(), key=lambda kv: int(kv[0])):
        held = pooled([h for _, h in runs])
        standings = held.standings()
        out["page"][page] = {**figures(standings[0]), "seeds": sorted({s for s, _ in runs})}
        for st in standings[1:]:
            label = "best single config" if st.label.startswith("best single config") else st.label
            entry = {**figures(st), **({"config": st.label.split(" ", 3)[3]} if label != st.label else {})}
            out["baselines"].setdefault(label, {})[page] = entry
    return out


def _met(page: dict[str, Any]) -> str:
    ok = (
        page["geomean"] is not None
        and page["geomean"] <= TARGET["geomean"]
        and page["within_3pct"] >= TARGET["within_3pct"]
        and page["worst"] <= TARGET["worst"]
    )
    return "met" if ok else "not met"


def markdown(doc: dict[str, Any], date: str, commands: str) -> str:
    """The page: Findings (dated) first, the table of baselines, then the commands."""
    lines = [
        "# Held-out shapes: the bundle's picks against the oracle and the baselines",
        "",
        f"## Findings ({date})",
        "",
    ]
    for page, f in doc["page"].items():
        seeds = ", ".join(map(str, f["seeds"]))
        lines.append(
            f"- **Page {page}**: pick / oracle geomean {f['geomean']:.3f}, {f['within_3pct']:.0%} of "
            f"{f['shapes']} shapes within 3 %, worst {f['worst']:.3f} (seeds {seeds}); the target "
            f"(geomean <= {TARGET['geomean']}, >= {TARGET['within_3pct']:.0%} within 3 %, worst <= "
            f"{TARGET['worst']}) is {_met(f)}."
        )
    pages = list(doc["page"])
    lines += [
        "",
        "| choosing by | " + " | ".join(f"page {p}: geomean, within 3 %, worst" for p in pages) + " |",
    ]
    lines.append("|---|" + "---|" * len(pages))
    rows = {"the bundle's pick": doc["page"], **doc["baselines"]}
    for label, per_page in rows.items():
        cells = [_cell(per_page.get(p)) for p in pages]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "## Commands", "", "```bash", commands.strip() or "(not given)", "```", ""]
    return "\n".join(lines)


def _cell(f: dict[str, Any] | None) -> str:
    if not f or f["geomean"] is None:
        return "-"
    config = f" `{f['config']}`" if "config" in f else ""
    return f"{f['geomean']:.3f}, {f['within_3pct']:.0%}, {f['worst']:.3f}{config}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--holdout", action="append", required=True, help="PAGE:SEED=BUNDLE_DIR:HOLDOUT_RUN")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--markdown", type=Path, required=True)
    parser.add_argument("--commands", type=Path)
    parser.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    args = parser.parse_args(argv)
    pages: dict[str, list[tuple[int, Holdout]]] = {}
    for spec in args.holdout:
        where, _, rest = spec.partition("=")
        page, _, seed = where.partition(":")
        bundle_dir, _, run_id = rest.rpartition(":")
        pages.setdefault(page, []).append(
            (int(seed), holdout_of(args.results, bundle_dir, run_id, args.margin))
        )
    doc = summary(pages)
    if args.json.exists():  # what other studies added (the confirmed picks) stays
        kept = json.loads(args.json.read_text())
        doc = {**{k: v for k, v in kept.items() if k not in doc}, **doc}
    args.json.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    commands = args.commands.read_text() if args.commands else ""
    args.markdown.write_text(markdown(doc, args.date, commands))
    print(json.dumps(doc["page"], sort_keys=True))


if __name__ == "__main__":
    main()
