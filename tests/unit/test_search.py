"""Search strategies, driven by a simulated device: each item gets a record with the config's true time.

The strategies are functions of the records they are given, so these tests play the dispatcher: they
draw items as their queue runs low, answer each with a record, and feed it back.
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from tests.conftest import TINY_STATIC
from tunectl.core.errors import SpecError
from tunectl.core.keys import key_text
from tunectl.core.plan import WorkItem, plan
from tunectl.core.record import Record
from tunectl.core.spec import parse_spec
from tunectl.decide.search import Search

SPEC = f"""
name = "s"
task = "decode_attention"
{TINY_STATIC}[shapes.batch]
values = [1, 2, 4, 8, 16]
[shapes.kv_len]
values = [64]
[configs]
num_splits = [1, 2, 4, 8, 16]
gqa = ["expand", "grouped"]
gather = ["index", "per_seq"]
"""

Oracle = Callable[[WorkItem], float]


def _spec(search: str) -> Any:
    return parse_spec(SPEC + textwrap.dedent(search), "s.toml")


def true_time(item: WorkItem) -> float:
    """A smooth landscape: the best split grows with the batch; grouped GQA and index gather help."""
    c, s = dict(item.config), dict(item.shape)
    best_split = max(1, 16 // s["batch"])
    t = 100.0 * s["batch"] * (1 + 0.3 * abs(math.log2(c.get("num_splits", 1) / best_split)))
    t *= 1.0 if c.get("gqa", "expand") == "grouped" else 1.6
    t *= 1.0 if c.get("gather", "index") == "index" else 1.1
    return t


def _record(item: WorkItem, oracle: Oracle, config: Any = None, i: int = 0) -> Record:
    config = config or item.config
    t = oracle(WorkItem(item.item_id, item.task, item.static, item.shape, config, False))
    speedup: dict[str, float] = {}
    if item.arms:
        base = oracle(WorkItem(item.item_id, item.task, item.static, item.shape, item.arms[0], True))
        speedup = {"speedup": base / t, "speedup_lo": base / t * 0.99, "speedup_hi": base / t * 1.01}
    return Record(
        run_id="r", item_id=item.record_ids()[i], task=item.task, static_key=key_text(item.static),
        shape_key=key_text(item.shape), config_key=key_text(config), status="ok",
        median_us=t, rel_noise=0.01, phase=item.phase,
        is_default=(item.is_default if not item.arms else i == 0) and config == item.config, **speedup,
    )  # fmt: skip


def answer(item: WorkItem, oracle: Oracle = true_time) -> list[Record]:
    """The records a device would return for ``item``: one, or one per arm."""
    return (
        [_record(item, oracle, a, i) for i, a in enumerate(item.arms)]
        if item.arms
        else [_record(item, oracle)]
    )


AHEAD = 4  # items the simulated dispatcher keeps queued


def drive(search: Search, oracle: Oracle = true_time, queue: list[WorkItem] | None = None) -> list[WorkItem]:
    """Run a search to its end (from ``queue``, default empty), drawing new points whenever fewer than
    ``AHEAD`` items wait, as the dispatcher does; every item it issued, in order."""
    queue = [] if queue is None else queue
    issued = list(queue)
    while True:
        more = search.draw(AHEAD - len(queue))
        issued += more
        queue += more
        if not queue:
            return issued
        more = search.follow_up(answer(queue.pop(0), oracle))
        issued += more
        queue += more


def _best(point_items: list[WorkItem]) -> float:
    return min(true_time(i) for i in point_items)


def test_grid_measures_everything_then_finals_with_the_default_first() -> None:
    work = plan(_spec(""))
    items = list(work.work_items())
    issued = drive(Search(work))
    measures = [i for i in issued if i.phase == "measure"]
    assert {i.item_id for i in measures} == {i.item_id for i in items} and len(measures) == len(items)
    finals = [i for i in issued if i.phase == "final"]
    assert len(finals) == 5  # one per point
    for f in finals:
        default = next(i.config for i in items if i.point == f.point and i.is_default)
        assert f.arms[0] == default and 2 <= len(f.arms) <= 4 and f.rounds == 8
        point = [i for i in items if i.point == f.point]
        assert min(true_time(WorkItem("", "", f.static, f.shape, a, False)) for a in f.arms) == _best(point)


def test_no_finals_where_nothing_comes_near_the_default() -> None:
    def default_fastest(item: WorkItem) -> float:
        return 1.0 if item.config == dict_default(item) else 2.0

    def dict_default(item: WorkItem) -> Any:
        return next(i.config for i in items if i.point == item.point and i.is_default)

    work = plan(_spec(""))
    items = list(work.work_items())
    issued = drive(Search(work), default_fastest)
    assert not [i for i in issued if i.phase == "final"]


def test_halving_screens_cheaply_keeps_the_default_and_finds_the_best() -> None:
    work = plan(_spec("[search]\nstrategy = 'halving'\neta = 3\nmin_budget = 0.1\n"))
    items = list(work.work_items())
    issued = drive(Search(work))
    per_point = Counter(i.point for i in items)
    rungs = Counter((i.point, i.rung) for i in issued if i.phase in ("screen", "measure"))
    for point, n in per_point.items():
        assert rungs[(point, 0)] == n  # every config screened
        assert rungs[(point, 1)] <= math.ceil(n / 3) + 1  # a third, plus the default
    budgets = {i.rung: i.budget for i in issued if i.rung is not None}
    assert budgets == {0: 0.1, 1: pytest.approx(0.3)}, "two screening rungs, then the finals"
    cost = sum(i.budget for i in issued if i.phase in ("screen", "measure"))
    assert cost < 0.25 * len(items), "measurement time well under the grid's"
    for f in (i for i in issued if i.phase == "final"):
        point = [i for i in items if i.point == f.point]
        assert f.arms[0] == next(i.config for i in point if i.is_default)
        assert min(true_time(WorkItem("", "", f.static, f.shape, a, False)) for a in f.arms) == _best(point)


@pytest.mark.parametrize("strategy", ["grid", "halving"])
def test_a_search_rebuilt_from_rows_asks_only_for_what_is_missing(strategy: str) -> None:
    spec = _spec(f"[search]\nstrategy = '{strategy}'\n")
    full = drive(Search(plan(spec)))
    # Stop half way: the rows of the first half of the items come back, the rest never ran.
    search = Search(plan(spec))
    queue, rows, done = search.draw(AHEAD), [], 0
    while queue and done < len(full) // 2:
        records = answer(queue.pop(0))
        rows += records
        queue += search.follow_up(records) + search.draw(AHEAD - len(queue))
        done += 1
    resumed = Search(plan(spec))
    resumed.start(rows)
    first = resumed.draw(AHEAD)
    recorded = {r.item_id for r in rows}
    assert first and all(not set(i.record_ids()) <= recorded for i in first)
    rest = drive(resumed, queue=first)
    assert {i.item_id for i in rest} | {i.item_id for i in full if set(i.record_ids()) <= recorded} == {
        i.item_id for i in full
    }


def test_a_noisy_config_whose_fast_mode_beats_the_default_reaches_the_finals() -> None:
    search = Search(plan(_spec("")))
    items = search.draw(1)  # the first point's configs, the default first
    [point] = search.points.values()
    assert [i.config for i in items] == list(point.configs)
    noisy = items[1].config
    finals = []
    for item in items:
        [row] = answer(item, lambda i: 100.0 if i.config != noisy else 150.0)
        if item.config == noisy:
            row = replace(row, p20_us=80.0)  # a fast mode under a slow median
        else:
            median = 100.0 if item.is_default else 104.0  # clearly behind the default
            row = replace(row, median_us=median, p20_us=median * 0.99)
        finals += search.follow_up([row])
    [final] = finals
    assert final.arms == (point.configs[0], noisy)


@pytest.mark.parametrize("strategy", ["grid", "halving"])
def test_the_estimate_counts_the_records_the_search_asks_for(strategy: str) -> None:
    search = Search(plan(_spec(f"[search]\nstrategy = '{strategy}'\nfinalists = 0\n")))
    before = search.estimate()
    asked = sum(len(i.record_ids()) for i in drive(search))
    # Halving cannot know ahead whether the default survives on its rank or joins the survivors.
    assert before == asked if strategy == "grid" else abs(before - asked) <= 2 * len(search.points)


def test_halving_without_finals_measures_the_last_survivors_in_full() -> None:
    work = plan(_spec("[search]\nstrategy = 'halving'\nfinalists = 0\n"))
    items = list(work.work_items())
    issued = drive(Search(work))
    assert not [i for i in issued if i.phase == "final"]
    for point in {i.point for i in items}:
        full = [i for i in issued if i.point == point and i.phase == "measure"]
        assert any(i.is_default for i in full) and 2 <= len(full) <= 4  # a third of 8, and the default
        best = _best([i for i in items if i.point == point])
        assert min(true_time(i) for i in full) == best


def test_a_spec_asking_for_the_model_strategy_is_refused_but_a_run_made_with_it_still_reads() -> None:
    retired = SPEC + "[search]\nstrategy = 'model'\nbudget = 0.3\nwarm_start = 1\n"
    with pytest.raises(SpecError, match=r"search\.strategy: 'model' was removed; use 'halving'"):
        parse_spec(retired, "s.toml")
    stored = parse_spec(retired, "s.toml", stored=True)
    assert stored.shapes == _spec("").shapes and stored.search.strategy == "grid"


def test_configs_are_ranked_only_against_rows_of_the_newest_timing_method() -> None:
    from tunectl.core.keys import make_key
    from tunectl.core.record import Record, Status, Timing
    from tunectl.decide.search import ranked_configs

    def row(config: int, median: float, timing: Timing, at: float) -> Record:
        return Record(
            run_id="r", item_id=f"i{config}", task="t", static_key="{}", shape_key="{}",
            config_key=key_text(make_key({"c": config})), is_default=config == 0, status=Status.OK,
            median_us=median, timing=timing, finished_at=at,
        )  # fmt: skip

    measured = {
        make_key({"c": 0}): row(0, 12.0, Timing.DIFFERENCE, 3.0),
        make_key({"c": 1}): row(1, 10.0, Timing.REPLAY, 1.0),  # faster, but timed the old way
        make_key({"c": 2}): row(2, 11.0, Timing.DIFFERENCE, 2.0),
    }
    assert ranked_configs(measured) == [make_key({"c": 2}), make_key({"c": 0})]
    assert ranked_configs({}) == []


@pytest.mark.parametrize("strategy", ["grid", "halving"])
def test_a_search_counts_what_is_missing_until_every_item_and_arm_has_its_record(strategy: str) -> None:
    work = plan(_spec(f"[search]\nstrategy = '{strategy}'\n"))
    search = Search(work)
    if strategy == "grid":
        assert search.missing() == work.num_items, "nothing drawn: every planned item is missing"
    # Play the dispatcher, but one comparison is lost on the way (its arms never come back).
    queue, lost = search.draw(AHEAD), None
    while queue:
        item = queue.pop(0)
        if item.arms and lost is None:
            lost = item
        else:
            queue += search.follow_up(answer(item))
        queue += search.draw(AHEAD - len(queue))
    assert lost is not None and search.draw(AHEAD) == [], "the search has nothing more to hand out"
    assert search.missing() == 1, "the lost comparison, counted once"
    search.follow_up(answer(lost)[:-1])
    assert search.missing() == 1, "a comparison short of one arm is still missing"
    search.follow_up(answer(lost)[-1:])
    assert search.missing() == 0


def test_fixed_work_counts_the_items_without_all_their_records() -> None:
    from tunectl.core.plan import comparison
    from tunectl.core.record import Phase
    from tunectl.decide.work import FixedItems

    items = list(plan(_spec("")).work_items())[:3]
    final = comparison(items[0].task, items[0].static, items[0].shape, (items[0].config, items[1].config),
                       Phase.VALIDATE, 2)  # fmt: skip
    work = FixedItems([*items, final])
    work.start(answer(items[0]))
    assert work.missing() == 3
    for item in work.draw(10):
        work.follow_up(answer(item)[:1])  # the comparison gets one arm of two
    assert work.missing() == 1
    work.follow_up(answer(final))
    assert work.missing() == 0


def _halving_finals(times: Callable[[int, int], float], finalists: int = 3) -> tuple[list[Any], WorkItem]:
    """The first point of a halving search answered with ``times(rung, i)`` for its i-th config (the
    default is 0; p20 1 % under the median); the point's configs and its finals item."""
    search = Search(plan(_spec(f"[search]\nstrategy = 'halving'\nfinalists = {finalists}\n")))
    queue = search.draw(1)
    [point] = search.points.values()
    configs = list(point.configs)
    while queue:
        item = queue.pop(0)
        if item.arms:
            return configs, item
        [row] = answer(item)
        t = times(item.rung or 0, configs.index(item.config))
        queue += search.follow_up([replace(row, median_us=t, p20_us=0.99 * t)])
    raise AssertionError("the point never reached its finals")


def test_a_config_read_slow_in_one_look_is_ranked_by_its_better_look() -> None:
    # The fastest config (1) meets a slowdown at rung 1 that nothing flagged: 15 % slow there only.
    def times(rung: int, i: int) -> float:
        if i == 1:
            return 115.0 if rung == 1 else 100.0
        return {0: 120.0, 2: 101.0, 3: 102.0, 4: 103.0, 5: 104.0}.get(i, 130.0 + i)

    configs, final = _halving_finals(times)
    assert final.arms[:2] == (configs[0], configs[1]), "ranked on its rung-0 look, it leads the finalists"


def test_near_ties_of_the_fastest_go_to_the_finals_up_to_twice_the_finalists() -> None:
    def spread(times: dict[int, float]) -> Callable[[int, int], float]:
        return lambda rung, i: 120.0 if i == 0 else times.get(i, 130.0 + i)

    # three finalists, and 4 within 2 % of the fastest; 5 is not
    configs, final = _halving_finals(spread({1: 100.0, 2: 100.5, 3: 101.0, 4: 101.5, 5: 103.5}))
    assert final.arms == (configs[0], *configs[1:5])
    # two finalists, and two more at most: 5 is as near as 3 and 4, over the cap
    configs, final = _halving_finals(spread({1: 100.0, 2: 100.5, 3: 101.0, 4: 101.5, 5: 101.9}), 2)
    assert final.arms == (configs[0], *configs[1:5])
