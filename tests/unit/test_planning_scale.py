"""A grid of a million items is planned and starts issuing without the driver ever holding its items.

The plan's point generator is wrapped in a guard that fails the test if it is drawn past what the
lane's look-ahead needs: the bound is on what planning does, not only on how much memory it took.
"""

from __future__ import annotations

import dataclasses
import tracemalloc
from collections import Counter
from collections.abc import Iterator

import pytest

from tunectl.core.keys import key_text
from tunectl.core.plan import Plan, Planned, WorkItem, plan
from tunectl.core.record import Record
from tunectl.core.spec import parse_spec
from tunectl.decide.search import Search
from tunectl.orchestrator.feed import Lane, LaneFeed, lookahead
from tunectl.tasks.cost_model import CostModel

CONFIGS = 10  # at every point: the default and nine others
WORKERS = 8
#: planning and first issue of the million-item grid stay under this (eager planning took ~700 MiB:
#: benchmarks/results/planning.md)
MEMORY_BOUND = 2 << 20


def grid(batches: int, kvs: int) -> str:
    def values(n: int) -> str:
        return "[" + ", ".join(str(i + 1) for i in range(n)) + "]"

    per_batch = ", ".join(f"{0.01 * (i + 1):.2f}" for i in range(CONFIGS - 1))
    return (
        f'name = "g"\ntask = "cost_model"\n[static]\ncapacity = 1000000000000\n'
        f'[shapes.batch]\nvalues = {values(batches)}\nbucket = "exact"\n'
        f'[shapes.kv_len]\nvalues = {values(kvs)}\nbucket = "exact"\n'
        f"[configs]\nper_batch_ms = [{per_batch}]\n[search]\nfinalists = 0\n"
    )


class Overdrawn(AssertionError):
    """The plan's points were drawn past what the look-ahead needs."""


@dataclasses.dataclass(frozen=True)
class GuardedPlan(Plan):
    """The plan itself, its points counted as they are drawn; past ``limit`` it raises."""

    limit: int = 0
    drawn: Counter[str] = dataclasses.field(default_factory=Counter)

    def points(self) -> Iterator[Planned]:
        for planned in super().points():
            if self.drawn["points"] >= self.limit:
                raise Overdrawn(f"point {self.limit + 1} drawn; the look-ahead needs {self.limit}")
            self.drawn["points"] += 1
            yield planned


def guarded(made: Plan, limit: int) -> GuardedPlan:
    fields = {f.name: getattr(made, f.name) for f in dataclasses.fields(Plan)}
    return GuardedPlan(**fields, limit=limit)


def answer(item: WorkItem) -> list[Record]:
    """An ok record for ``item``, the default fastest."""
    return [Record(run_id="r", item_id=item.item_id, task=item.task, static_key=key_text(item.static),
                   shape_key=key_text(item.shape), config_key=key_text(item.config), status="ok",
                   median_us=1.0 if item.is_default else 2.0, is_default=item.is_default)]  # fmt: skip


def test_a_million_item_grid_is_planned_and_first_issued_in_bounded_memory() -> None:
    spec, task = parse_spec(grid(1000, 100), "g.toml"), CostModel()
    ahead = lookahead(WORKERS)
    tracemalloc.start()
    try:
        made = plan(spec, task)
        search = Search(guarded(made, -(-ahead // CONFIGS)), spec.search)
        search.start(())
        first = search.draw(ahead)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert made.num_items == 1000 * 100 * CONFIGS
    assert ahead <= len(first) < ahead + CONFIGS and len({i.item_id for i in first}) == len(first)
    assert peak < MEMORY_BOUND, f"planning and first issue took {peak / 2**20:.1f} MiB"
    with pytest.raises(Overdrawn):
        search.draw(CONFIGS)  # the guard is live: one point more is past its limit


def test_a_lane_draws_new_points_only_as_its_queue_runs_low_and_issues_each_item_once() -> None:
    spec = parse_spec(grid(40, 5), "g.toml")  # 200 points, 2000 items
    made = plan(spec, CostModel())
    search = Search(made, spec.search)
    lane = Lane("cpu", tuple(range(2)), search, tuple(search.draw(lookahead(2))))
    feed = LaneFeed(lane)
    issued: Counter[str] = Counter()
    most_queued = 0
    while True:
        feed.top_up()
        most_queued = max(most_queued, len(feed))
        item = feed.queue.pop(None, set())
        if item is None:
            break
        issued[item.item_id] += 1
        feed.answered(answer(item))
        # Points are drawn only to keep the queue full: never more than what was issued plus the look-ahead.
        assert len(search.points) * CONFIGS <= sum(issued.values()) + feed.ahead + CONFIGS
    assert set(issued.values()) == {1} and set(issued) == {i.item_id for i in made.work_items()}
    assert feed.ahead <= most_queued < feed.ahead + CONFIGS
