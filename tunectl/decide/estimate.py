"""What a spec will cost before it runs: items per static key, and a time taken from earlier runs.

Counting never makes the items (``tunectl.core.plan.count_plan``), so a dry run of a very large grid
takes memory in proportion to its points, not its items.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tunectl.core.plan import PlanCount, count_plan
from tunectl.core.record import Phase, Record
from tunectl.core.spec import Spec, load_spec


@dataclass(frozen=True)
class DryRun:
    """A spec's planned work, and what earlier runs of its task say one item and one comparison take."""

    count: PlanCount
    num_comparisons: int  # finals: one per point (the default against up to ``finalists`` configs)
    item_s: float | None  # seconds a planned item took in earlier runs (its looks); None without any
    comparison_s: float | None  # median seconds per finals comparison in earlier runs
    num_earlier: int  # the earlier looks (measurements and screening looks) the estimate rests on

    @property
    def seconds(self) -> float | None:
        """Device seconds for the whole spec on one worker (divide by the workers), or None."""
        if self.item_s is None:
            return None
        return self.count.num_items * self.item_s + self.num_comparisons * (self.comparison_s or 0.0)


def dry_run(spec: Spec | str | Path, results: str | Path | None = None) -> DryRun:
    """Count ``spec``'s work (a Spec, or a spec file's path) and estimate its time from the records of
    ``results`` (if it exists)."""
    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    counted = count_plan(spec)
    num_points = sum(points for _, points, _ in counted.per_static)
    comparisons = num_points if spec.search.finalists else 0
    item_s, comparison_s, n = _durations(_earlier_records(spec, results))
    return DryRun(counted, comparisons, item_s, comparison_s, n)


def _earlier_records(spec: Spec, results: str | Path | None) -> list[Record]:
    if results is None or not Path(results).is_dir():
        return []
    from tunectl.store.results import read_results

    return read_results(results, task=spec.task)


def _durations(records: Iterable[Record]) -> tuple[float | None, float | None, int]:
    """Seconds a planned item took, and the median seconds of a comparison (its arms share one
    span). An item's seconds are its looks' together (a successive-halving search looks at an item
    once per rung it reaches; a grid, once), over the items looked at. A worker takes a batch of a
    point's looks in one call, whose rows share its start (and worker): each took its share of the
    call's span, not the whole of it."""
    calls: dict[tuple[str, float], list[float]] = {}  # (worker, start) -> its looks' ends
    items: set[tuple[str, str, str, str]] = set()
    groups: dict[str, tuple[float, float]] = {}
    for record in records:
        if not record.started_at or not record.finished_at:
            continue
        span = (record.started_at, record.finished_at)
        if record.phase is Phase.FINAL and record.group_id:
            lo, hi = groups.get(record.group_id, span)
            groups[record.group_id] = (min(lo, span[0]), max(hi, span[1]))
        elif record.phase in (Phase.MEASURE, Phase.SCREEN):
            calls.setdefault((record.worker, record.started_at), []).append(record.finished_at)
            items.add((record.run_id, record.static_key, record.shape_key, record.config_key))
    looks_s = math.fsum(max(ends) - start for (_, start), ends in calls.items())
    item_s = looks_s / len(items) if items else None
    comparison_s = statistics.median(hi - lo for lo, hi in groups.values()) if groups else None
    return item_s, comparison_s, sum(map(len, calls.values()))
