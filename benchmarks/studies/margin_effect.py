"""How many bundle entries the practical-equivalence margin changes on the recorded H200 results.

Unpacks an archive of recorded results (by default ``/tmp/h200_results.tar.gz``, the H200 runs, restored
from git history as benchmarks/results/DATA.md says), selects each tuning run's winners as ``tunectl
export bundle`` does with ``--margin 0`` and with the default ``--margin 0.02``, and prints, per run
and in all, how many entries change config, and which:

    python benchmarks/studies/margin_effect.py [--archive PATH] [--margin 0.02]
"""

from __future__ import annotations

import argparse
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.studies.h200_archive import ARCHIVE, require
from tunectl.core.keys import Key, key_text
from tunectl.core.record import SELECTED_PHASES
from tunectl.decide.select import Winner
from tunectl.formats.export import facts_of, select_from
from tunectl.store.results import read_results
from tunectl.store.runs import list_runs


def compare(root: Path, margin: float) -> list[str]:
    """Lines: per tuning run, entries and how many change from margin 0 to ``margin``; then each change."""
    lines, changes, num_entries, num_changed = [], [], 0, 0
    for info in sorted(list_runs(root), key=lambda i: i.run_id):
        if info.kind != "tune":
            continue
        records = [r for r in read_results(root, run_ids=[info.run_id]) if r.phase in SELECTED_PHASES]
        facts = facts_of(root, [info.run_id])
        before = {_point(w): w for w in select_from(records, facts, margin=0.0)}
        after = {_point(w): w for w in select_from(records, facts, margin=margin)}
        changed = [k for k in before if before[k].config != after[k].config]
        num_entries += len(before)
        num_changed += len(changed)
        lines.append(
            f"{info.run_id} ({info.name}, {info.task}): {len(changed)} of {len(before)} entries change"
        )
        for k in changed:
            b, a = before[k], after[k]
            changes.append(
                f"  {info.task} {key_text(b.static)} {key_text(b.shape)}: {key_text(b.config)} "
                f"({b.speedup:.3f}x, interval {b.speedup_lo:.3f}-{b.speedup_hi:.3f}, {b.basis}) -> "
                f"{'the default' if a.is_default else key_text(a.config)}"
            )
    return [*lines, f"in all: {num_changed} of {num_entries} entries change with margin {margin}", *changes]


def _point(winner: Winner) -> tuple[str, str, Key, Key]:
    return (winner.task, winner.device_name, winner.static, winner.shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--archive", type=Path, default=ARCHIVE)
    parser.add_argument("--margin", type=float, default=0.02)
    args = parser.parse_args()
    require(args.archive)
    with tempfile.TemporaryDirectory(prefix="tunectl-margin-") as tmp:
        with tarfile.open(args.archive) as tar:
            tar.extractall(tmp, filter="data")
        roots = sorted({p.parent.parent for p in Path(tmp).rglob("_runs/*.json")})
        for root in roots:
            print(f"# results {root.relative_to(tmp)}")
            print("\n".join(compare(root, args.margin)))


if __name__ == "__main__":
    main()
