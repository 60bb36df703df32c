"""Looks not taken: a config far behind at every point near a point gets no first look there; the
search then goes on as for a failed look, and finds the winners it finds when every config is looked at.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.unit.test_refine import _time_us, answer
from tunectl.core.keys import Key, key_text, make_key
from tunectl.core.plan import WorkItem, plan
from tunectl.core.record import Phase, Record, Status
from tunectl.core.spec import parse_spec
from tunectl.decide.dominated import Dominance
from tunectl.decide.points import Point
from tunectl.decide.search import Search
from tunectl.tasks.cost_model import CostModel

STATIC = make_key({"dtype": "float32"})
FAST, SLOW, DEFAULT = (make_key({"split": s}) for s in (8, 1, 2))


def _point(batch: int, looks: dict[Key, float], drift: bool = False) -> Point:
    shape = make_key({"batch": batch, "kv_len": 1024})
    point = Point(STATIC, shape, (DEFAULT, FAST, SLOW))
    for i, (config, us) in enumerate(looks.items()):
        point.records[f"{batch}-{i}"] = Record(
            run_id="r", item_id=f"{batch}-{i}", task="t", static_key=key_text(STATIC),
            shape_key=key_text(shape), config_key=key_text(config), status="ok", median_us=us,
            phase=Phase.SCREEN, rung=0, drift=drift, is_default=config == DEFAULT,
        )  # fmt: skip
    return point


def _rule(factor: float, split_params: tuple[str, ...] = ()) -> tuple[Dominance, Point]:
    """A rule knowing batch 8 and 32 (SLOW 2.5x and 2.1x their fastest, the default 4x), and batch 16."""
    rule = Dominance(factor, split_params)
    for near in (_point(8, {FAST: 10.0, SLOW: 25.0, DEFAULT: 40.0}), _point(32, {FAST: 10.0, SLOW: 21.0})):
        rule.add(near)
    here = _point(16, {})
    rule.add(here)
    return rule, here


def test_a_config_far_behind_at_every_point_near_is_not_looked_at() -> None:
    rule, here = _rule(2.0)
    why = rule.why(here, [DEFAULT, FAST, SLOW])
    assert set(why) == {SLOW}  # the default is always looked at, whatever it read near
    assert "batch=32" in why[SLOW] and "2.10x" in why[SLOW] and "1 other point" in why[SLOW]
    rule, here = _rule(2.2)
    assert rule.why(here, [SLOW]) == {}  # within the factor at one of them: looked at
    rule, here = _rule(0.0)
    assert rule.why(here, [SLOW]) == {}  # off


def test_only_points_near_enough_and_looks_the_guard_did_not_flag_say_anything() -> None:
    rule = Dominance(2.0)
    rule.add(_point(4, {FAST: 10.0, SLOW: 50.0}))  # four times smaller: too far to say
    rule.add(_point(8, {FAST: 10.0, SLOW: 50.0}, drift=True))  # flagged by the drift guard
    here = _point(16, {})
    rule.add(here)
    assert rule.why(here, [SLOW]) == {}
    rule.add(_point(24, {FAST: 10.0, SLOW: 30.0}))
    assert set(rule.why(here, [SLOW])) == {SLOW}


# A cost-model grid (no split counts: every config may be left out): batch 1-12, constant-cost configs
# from 4x faster than the default to 3x slower, and one whose cost grows with the batch (the fastest
# at small batches, behind the fastest constant one from batch 13).
GRID = """
name = "d"
task = "cost_model"
[static]
capacity = 1000000
[shapes.batch]
values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
[shapes.kv_len]
values = [1024]
[[configs]]
fixed_ms = [0.25, 0.4, 3.0]
[[configs]]
fixed_ms = 0.0
per_batch_ms = 0.02
[search]
strategy = "halving"
"""


def _drive(search: Search) -> tuple[list[WorkItem], list[Record]]:
    """The dispatcher played (``test_search.drive``), a look marked ``skip`` answered as it answers it:
    a ``dominated`` row, no measurement. Every item issued and every row."""
    queue: list[WorkItem] = []
    issued: list[WorkItem] = []
    rows: list[Record] = []
    while True:
        more = search.draw(4 - len(queue))
        issued += more
        queue += more
        if not queue:
            return issued, rows
        item = queue.pop(0)
        records = answer(item)
        if item.skip:
            gone = {"status": Status.DOMINATED, "median_us": None, "message": item.skip}
            records = [replace(r, **gone) for r in records]
        rows += records
        more = search.follow_up(records)
        issued += more
        queue += more


def _work(extra: str = "") -> Search:
    spec = parse_spec(GRID + extra, "d.toml")
    return Search(plan(spec, CostModel()), spec.search)


def test_halving_leaves_out_far_behind_looks_and_still_finds_every_winner() -> None:
    full, _ = _drive(_work("skip_dominated = 0\n"))
    issued, rows = _drive(_work())
    skipped = [i for i in issued if i.skip]
    assert skipped and all(i.phase == "screen" and i.rung == 0 and not i.is_default for i in skipped)
    assert not [i for i in skipped if dict(i.shape)["batch"] == 1]  # the first point has nothing near
    for item in skipped:  # each far behind at its own point too
        fastest = min(_time_us(i, i.config) for i in full if i.point == item.point and i.rung == 0)
        assert _time_us(item, item.config) > 1.2 * fastest
    assert {dict(i.config)["fixed_ms"] for i in skipped} >= {3.0, 0.25}
    assert sum(r.status == Status.DOMINATED for r in rows) == len(skipped)
    assert _winners(issued) == _winners(full)  # the fastest arm of every point's finals
    first = {i.item_id for i in full if i.rung == 0}
    assert {
        i.item_id for i in issued if i.rung == 0
    } == first  # a look left out is still an item, with its row
    assert len(issued) < len(full)  # and the later rungs are shorter for it


def _winners(issued: list[WorkItem]) -> dict[Any, Any]:
    return {i.point: min(i.arms, key=lambda a: _time_us(i, a)) for i in issued if i.phase == "final"}


def test_a_member_of_a_split_family_is_always_looked_at() -> None:
    rule, here = _rule(2.0, split_params=("split",))
    assert rule.why(here, [SLOW]) == {}  # SLOW sets a split count: its far-off times teach the wave model
    rule, here = _rule(2.0, split_params=("other",))
    assert set(rule.why(here, [SLOW])) == {SLOW}


def test_a_resumed_search_takes_the_dominated_rows_as_done() -> None:
    _, rows = _drive(_work())
    assert any(r.status == Status.DOMINATED for r in rows)
    resumed = _work()
    resumed.start(rows)
    assert resumed.draw(100) == [] and resumed.missing() == 0
