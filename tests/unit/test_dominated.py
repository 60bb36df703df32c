"""Looks not taken: a config far behind at every point near a point gets no first look there; the
search then goes on as for a failed look, and finds the winners it finds when every config is looked at.
"""

from __future__ import annotations

from dataclasses import replace

from tests.unit.test_search import _spec, answer, true_time
from tunectl.core.keys import Key, key_text, make_key
from tunectl.core.plan import WorkItem, plan
from tunectl.core.record import Phase, Record, Status
from tunectl.decide.dominated import Dominance
from tunectl.decide.points import Point
from tunectl.decide.search import Search

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


def test_a_config_far_behind_at_every_point_near_is_not_looked_at() -> None:
    rule = Dominance(2.0)
    for near in (_point(8, {FAST: 10.0, SLOW: 25.0, DEFAULT: 40.0}), _point(32, {FAST: 10.0, SLOW: 21.0})):
        rule.add(near)
    here = _point(16, {})
    rule.add(here)
    why = rule.why(here, [DEFAULT, FAST, SLOW])
    assert set(why) == {SLOW}  # the default is always looked at, whatever it read near
    assert "batch=32" in why[SLOW] and "2.10x" in why[SLOW] and "1 other point" in why[SLOW]
    assert Dominance(2.5).why(here, [SLOW]) == {}  # within the factor at one of them: looked at
    assert Dominance(0.0).why(here, [SLOW]) == {}  # off


def test_only_points_near_enough_and_looks_the_guard_did_not_flag_say_anything() -> None:
    rule = Dominance(2.0)
    rule.add(_point(4, {FAST: 10.0, SLOW: 50.0}))  # four times smaller: too far to say
    rule.add(_point(8, {FAST: 10.0, SLOW: 50.0}, drift=True))  # flagged by the drift guard
    here = _point(16, {})
    rule.add(here)
    assert rule.why(here, [SLOW]) == {}
    rule.add(_point(24, {FAST: 10.0, SLOW: 30.0}))
    assert set(rule.why(here, [SLOW])) == {SLOW}


def _drive(search: Search) -> tuple[list[WorkItem], list[Record]]:
    """``test_search.drive``, answering a look marked ``skip`` as the dispatcher does (a ``dominated``
    row, no measurement); every item issued and every row."""
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
        records = [replace(r, rung=item.rung) for r in answer(item)]
        if item.skip:
            records = [
                replace(r, status=Status.DOMINATED, median_us=None, message=item.skip) for r in records
            ]
        rows += records
        more = search.follow_up(records)
        issued += more
        queue += more


def test_halving_leaves_out_far_behind_looks_and_still_finds_every_winner() -> None:
    spec = "[search]\nstrategy = 'halving'\n"
    full, _ = _drive(Search(plan(_spec(spec + "skip_dominated = 0\n"))))
    issued, rows = _drive(Search(plan(_spec(spec))))
    skipped = [i for i in issued if i.skip]
    assert skipped and all(i.phase == "screen" and i.rung == 0 and not i.is_default for i in skipped)
    assert not [i for i in skipped if dict(i.shape)["batch"] == 1]  # the first point has nothing near
    first = [i for i in full if i.rung == 0]
    for item in skipped:  # each was far behind at its own point too
        best = min(true_time(i) for i in first if i.point == item.point)
        assert true_time(item) > 1.5 * best
    assert sum(r.status == Status.DOMINATED for r in rows) == len(skipped)
    assert {i.point: i.arms for i in issued if i.phase == "final"} == {
        i.point: i.arms for i in full if i.phase == "final"
    }  # the same finals, so the same winners
    assert len(issued) == len(full)  # a dominated look is still a planned item, with its row


def test_a_resumed_search_takes_the_dominated_rows_as_done() -> None:
    spec = _spec("[search]\nstrategy = 'halving'\n")
    _, rows = _drive(Search(plan(spec)))
    dominated = {r.item_id for r in rows if r.status == Status.DOMINATED}
    assert dominated
    resumed = Search(plan(spec))
    resumed.start(rows)
    assert resumed.draw(100) == [] and resumed.missing() == 0
