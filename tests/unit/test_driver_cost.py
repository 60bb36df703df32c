"""What a finished item costs the driver does not grow with the grid.

The driver takes a record back every few milliseconds from a large fleet, so the work a record costs
(search, refinement and probes together) must be the work of its own point, and the work of a call
in proportion to what it hands out. Counted here, not timed: how often a point's needs are worked
out, an item is named and an item is checked for its records, in each call the dispatcher makes
(``draw``, ``follow_up``; ``missing`` and ``estimate`` at the end), over a whole run of a grid of 50
points and one of 400 (two static keys each, successive halving, finals, refinement and probes), the
dispatcher played as in tests/unit/test_refine.py.

The worst call is compared, not the average over the run: a walk over a static key's points or its
probes on every record costs in proportion to the grid, but only in the stretches it is made in
(while a static key's refined points are measured, or once its probes are out), which an average
over the whole run hides.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from tests.unit.test_refine import answer
from tunectl.core.plan import WorkItem, plan
from tunectl.core.spec import parse_spec
from tunectl.decide.inline_probes import probed
from tunectl.decide.refine import refined
from tunectl.decide.search import Looks, Search
from tunectl.tasks.cost_model import CostModel

AHEAD = 16  # items the simulated dispatcher keeps queued


def grid(batches: list[int], kvs: list[int]) -> str:
    """A cost_model spec over ``batches`` x ``kvs`` at two static keys: winners that change over the grid,
    so refinement and finals happen."""
    return f"""
name = "cost"
task = "cost_model"
[static]
capacity = [100000000, 200000000]
[shapes.batch]
range = [1, {batches[-1]}]
values = {batches}
bucket = "ceil"
[shapes.kv_len]
range = [256, {kvs[-1]}]
values = {kvs}
bucket = "ceil"
[configs]
per_batch_ms = [0.02, 0.05, 0.1]
per_kv_ms = [0.05, 0.2]
[search]
strategy = "halving"
refine_budget = 4
probes = 1
"""


SMALL = grid([4 * i for i in range(1, 11)], [4096 * i for i in range(1, 6)])  # 50 points
LARGE = grid([2 * i for i in range(1, 21)], [1024 * i for i in range(1, 21)])  # 400 points


#: the work counted: a point's needs worked out, an item named, an item checked for its records
WORK = {"_needs": (Search, "_needs"), "item": (Looks, "item"), "record_ids": (WorkItem, "record_ids")}


@dataclass
class Cost:
    records: Counter[str]  # records fed back, by phase
    refined: int  # points refinement added
    worst: Counter[str]  # per kind of work: the most a call did per item it handed out (plus one)
    at_end: Counter[str]  # the work of ``missing`` and ``estimate`` once the run is done


def counted(patch: pytest.MonkeyPatch, counts: Counter[str]) -> None:
    """Count each kind of ``WORK`` into ``counts`` as it is done."""
    for kind, (cls, name) in WORK.items():
        patch.setattr(cls, name, counting(getattr(cls, name), kind, counts))


def counting(inner: Any, kind: str, counts: Counter[str]) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counts[kind] += 1
        return inner(*args, **kwargs)

    return wrapper


def run_counted(spec_text: str) -> Cost:
    """A whole run of the spec's work (search, refinement, probes), played as the dispatcher plays it,
    its work counted call by call."""
    spec, task = parse_spec(spec_text, "cost.toml"), CostModel()
    made = plan(spec, task)

    def check(static: Any, shape: Any) -> str | None:
        return task.check_point(dict(static), dict(shape))

    search = Search(made, spec.search)
    work = probed(refined(search, made, check), search, made, check, None)
    counts: Counter[str] = Counter()
    with pytest.MonkeyPatch.context() as patch:
        counted(patch, counts)
        records, worst = drive(work, counts)
        before = counts.copy()
        assert work.missing() == 0 and work.estimate() >= records.total()
    planned = sum(n for _, n, _ in made.count.per_static)
    return Cost(records, len(search.points) - planned, worst, counts - before)


def drive(work: Any, counts: Counter[str]) -> tuple[Counter[str], Counter[str]]:
    """Hand out and answer every item, ``AHEAD`` kept queued: the records fed back (by phase), and per
    kind of work the most one call did per item it handed out (plus one)."""
    queue: list[WorkItem] = []
    fed: Counter[str] = Counter()
    worst: Counter[str] = Counter()

    def call(method: Any, *args: Any) -> list[WorkItem]:
        before = counts.copy()
        items: list[WorkItem] = method(*args)
        for kind in WORK:
            worst[kind] = max(worst[kind], (counts[kind] - before[kind]) / (1 + len(items)))
        return items

    while True:
        queue += call(work.draw, AHEAD - len(queue))
        if not queue:
            return fed, worst
        records = answer(queue.pop(0))
        fed.update(str(r.phase) for r in records)
        queue += call(work.follow_up, records)


@pytest.fixture(scope="module")
def costs() -> dict[str, Cost]:
    return {"small": run_counted(SMALL), "large": run_counted(LARGE)}


def test_both_grids_are_screened_refined_and_probed(costs: dict[str, Cost]) -> None:
    for cost in costs.values():
        assert cost.refined > 0 and {"screen", "final", "probe"} <= set(cost.records)
    assert costs["large"].records.total() > 6 * costs["small"].records.total()


@pytest.mark.parametrize("kind", list(WORK))
def test_a_call_works_in_proportion_to_what_it_hands_out_whatever_the_size_of_the_grid(
    costs: dict[str, Cost], kind: str
) -> None:
    small, large = costs["small"].worst[kind], costs["large"].worst[kind]
    assert large <= small + 2, f"{kind}: {small:.1f} per item handed out at 50 points, {large:.1f} at 400"


def test_what_is_missing_and_the_estimate_are_counted_not_worked_out(costs: dict[str, Cost]) -> None:
    for cost in costs.values():
        assert not cost.at_end, cost.at_end
