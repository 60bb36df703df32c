"""Where the recorded H200 results live, and one line on how to get them where they are absent.

The studies here read the H200 runs' Parquet results, ``h200_results.tar.gz`` (12.9 MB). It is kept
in git history, not in the tree (benchmarks/results/DATA.md); unpacked, it is ``/tmp/res2``::

    git show 45ad4e3:benchmarks/results/h200_results.tar.gz > /tmp/h200_results.tar.gz
    tar xzf /tmp/h200_results.tar.gz -C /tmp
"""

from __future__ import annotations

import sys
from pathlib import Path

ARCHIVE = Path("/tmp/h200_results.tar.gz")
RESULTS = Path("/tmp/res2")  # where ARCHIVE unpacks
RESTORE = (
    "git show 45ad4e3:benchmarks/results/h200_results.tar.gz > /tmp/h200_results.tar.gz"
    " && tar xzf /tmp/h200_results.tar.gz -C /tmp"
)


def require(path: Path) -> Path:
    """``path`` if it exists; else exit 2 with one line naming the command that restores the records."""
    if not path.exists():
        print(f"error: {path} is absent; restore the H200 records with: {RESTORE}", file=sys.stderr)
        raise SystemExit(2)
    return path
