"""Refinement, driven by a simulated device: each item gets a record with the config's true time.

The cost model task (tunectl/tasks/cost_model.py) says what each config costs at each shape, so where the
winner changes is known: the per-batch config beats the default below batch 20. These tests play
the dispatcher, as tests/unit/test_search.py does: take the items the work asks for, answer each with the
record a device would give (its true time, 1 % noise), and feed them back.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from typing import Any

import pytest

from tunectl.core.errors import SpecError
from tunectl.core.keys import Key, key_text, make_key
from tunectl.core.plan import WorkItem, plan
from tunectl.core.record import Record
from tunectl.core.spec import parse_spec
from tunectl.decide.refine import Refined, candidates, midpoint, refined
from tunectl.decide.search import Search
from tunectl.decide.select import Winner
from tunectl.tasks.cost_model import CostModel, cost_ms

SPEC = """
name = "r"
task = "cost_model"
[static]
capacity = 1000000
[shapes.batch]
range = [1, 64]
values = [1, 8, 64]
bucket = "ceil"
[shapes.kv_len]
values = [1024]
bucket = "ceil"
[configs]
per_batch_ms = 0.05
[measure]
max_seconds = 0.1
"""


def _spec(extra: str = "", base: str = SPEC) -> Any:
    return parse_spec(base + textwrap.dedent(extra), "r.toml")


def _time_us(item: WorkItem, config: Key) -> float:
    return cost_ms(dict(config), dict(item.shape)) * 1e3


def answer(item: WorkItem, run_id: str = "r") -> list[Record]:
    """The records a device returns for ``item``: the true time with 1 % noise; per arm for a comparison."""
    common = dict(run_id=run_id, task=item.task, static_key=key_text(item.static),
                  shape_key=key_text(item.shape), status="ok", rel_noise=0.01, phase=item.phase,
                  rung=item.rung)  # fmt: skip
    if not item.arms:
        t = _time_us(item, item.config)
        return [Record(item_id=item.item_id, config_key=key_text(item.config), is_default=item.is_default,
                       median_us=t, p20_us=t * 0.99, p80_us=t * 1.01, **common)]  # fmt: skip
    base = _time_us(item, item.arms[0])
    out = []
    for i, (arm, rid) in enumerate(zip(item.arms, item.record_ids(), strict=True)):
        t = _time_us(item, arm)
        out.append(Record(item_id=rid, config_key=key_text(arm), is_default=i == 0, median_us=t,
                          p20_us=t * 0.99, p80_us=t * 1.01, group_id=item.item_id, rounds=item.rounds,
                          speedup=base / t, speedup_lo=base / t * 0.99, speedup_hi=base / t * 1.01,
                          **common))  # fmt: skip
    return out


def work_of(spec: Any) -> Any:
    task = CostModel()
    made = plan(spec, task)
    return refined(Search(made, spec.search), made, lambda s, h: task.check_point(dict(s), dict(h)))


def drive(work: Any, records: list[Record] | None = None, stop_after: int | None = None) -> list[Record]:
    """Play the dispatcher until the work asks for nothing more (or ``stop_after`` items ran), drawing
    new points whenever fewer than four items wait."""
    written = list(records or [])
    work.start(written)
    queue: list[WorkItem] = []
    num_run = 0
    while True:
        queue += work.draw(4 - len(queue))
        if not queue or (stop_after is not None and num_run == stop_after):
            return written
        item = queue.pop(0)
        got = answer(item)
        written += got
        num_run += 1
        queue += work.follow_up(got)


def batches(records: list[Record]) -> list[int]:
    return sorted({dict(r.shape)["batch"] for r in records})


def test_midpoints_are_integers_rounded_to_the_step() -> None:
    assert midpoint(16, 32) == 24
    assert midpoint(2048, 4096, 512) == 3072
    assert midpoint(1024, 2048, 512) == 1536
    assert midpoint(16, 17) is None
    assert midpoint(2048, 2560, 512) is None  # no multiple of 512 strictly between


def _winner(config: dict[str, float], batch: int, speedup: float, *, default: bool = False) -> Winner:
    static, shape = make_key({"capacity": 1}), make_key({"batch": batch})
    return Winner("cost_model", "cpu", static, shape, make_key(config), default, 1.0, 1.0, 1.0, 0.01, 10,
                  1.0, "r", 2, 0, speedup, speedup * 0.99, speedup * 1.01)  # fmt: skip


def test_a_midpoint_is_planned_where_winners_differ_or_the_advantage_moves_beyond_noise() -> None:
    dims = _spec().shapes
    batch = [d for d in dims if d.name == "batch"]
    a, b = {"per_batch_ms": 0.05}, {"fixed_ms": 1.0}
    differ = {
        make_key({"batch": 8}): _winner(a, 8, 2.5),
        make_key({"batch": 64}): _winner(b, 64, 1.0, default=True),
    }
    assert candidates(differ, differ, batch) == [make_key({"batch": 36})]
    same = {make_key({"batch": 8}): _winner(a, 8, 1.50), make_key({"batch": 16}): _winner(a, 16, 1.51)}
    assert candidates(same, same, batch) == []  # overlapping intervals: they agree
    moved = {make_key({"batch": 8}): _winner(a, 8, 2.5), make_key({"batch": 16}): _winner(a, 16, 1.25)}
    assert candidates(moved, moved, batch) == [make_key({"batch": 12})]
    assert candidates(moved, [*moved, make_key({"batch": 12})], batch) == []  # known already


def test_refinement_finds_the_batch_where_the_winner_changes() -> None:
    records = drive(work_of(_spec()))
    tuned = batches(records)
    assert {1, 8, 64} <= set(tuned) and len(tuned) > 3
    # The breakpoint is at batch 20 (0.05 ms x 20 = the default's 1 ms): the points close in on it.
    below = max(b for b in tuned if b < 20)
    above = min(b for b in tuned if b > 20)
    assert above - below <= 4, tuned
    # Between 1 and 8 both points have the per-batch config winning, but by 20x and 2.5x: beyond the
    # noise, so refinement looks there too.
    assert any(1 < b < 8 for b in tuned)


def test_the_budget_caps_the_extra_points_per_static_key() -> None:
    for budget, most in (("2", 2), ("0.5", 2)):  # 0.5 of 3 starting points: 2
        records = drive(work_of(_spec(f"[search]\nrefine_budget = {budget}\n")))
        assert len(batches(records)) <= 3 + most
        assert len(batches(records)) == 3 + most
    assert not isinstance(work_of(_spec("[search]\nrefine_budget = 0\n")), Refined)


def test_refinement_composes_with_halving() -> None:
    records = drive(work_of(_spec('[search]\nstrategy = "halving"\n')))
    assert len(batches(records)) > 3
    assert {str(r.phase) for r in records} >= {"screen", "final"}


def test_a_resumed_refinement_plans_the_same_points_and_writes_each_row_once() -> None:
    whole = drive(work_of(_spec()))
    for stop in (3, 10, 17, len(whole) // 2):
        first = drive(work_of(_spec()), stop_after=stop)
        resumed = drive(work_of(_spec()), records=first)
        ids = Counter(r.item_id for r in resumed)
        assert max(ids.values()) == 1, f"duplicated rows after a stop at item {stop}"
        assert set(ids) == {r.item_id for r in whole}


def test_a_refined_point_the_task_cannot_run_is_not_planned() -> None:
    spec = _spec()
    made = plan(spec, CostModel())

    def check(static: Key, shape: Key) -> str | None:  # a device on which batch 36 does not fit
        return "over the memory" if dict(shape)["batch"] == 36 else None

    work = refined(Search(made, spec.search), made, check)
    records = drive(work)
    assert 36 not in batches(records)
    assert [dict(s)["batch"] for per in work.refused.values() for s in per] == [36]


def test_refinement_closes_in_on_the_largest_point_that_can_run() -> None:
    spec = _spec("", SPEC.replace("capacity = 1000000", "capacity = 40960"))  # batch 40 x 1024 fits, 64 not
    records = drive(work_of(spec))
    assert 64 not in batches(records) and max(batches(records)) >= 36


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("range = [64, 1]\nvalues = [1]", "shapes.batch.range: lo must be below hi"),
        ("range = [1, 64]\nvalues = [128]", "shapes.batch.values: every value must lie in the range [1, 64]"),
        ('range = [1, 64]\nbucket = "pow2"', "shapes.batch.bucket: a range needs a bucket"),
        ('range = "1-64"', "shapes.batch.range: must be [lo, hi], two positive integers"),
        ('range = [1, 64]\nstep = 0\nbucket = "ceil"', "shapes.batch.step: must be a positive integer"),
    ],
)
def test_a_bad_range_is_one_line_naming_the_field(table: str, message: str) -> None:
    text = SPEC.replace('range = [1, 64]\nvalues = [1, 8, 64]\nbucket = "ceil"', table)
    with pytest.raises(SpecError) as err:
        parse_spec(text, "r.toml")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_range_without_values_starts_at_its_ends_and_the_powers_of_two_between() -> None:
    spec = _spec("", SPEC.replace("values = [1, 8, 64]\n", "").replace("range = [1, 64]", "range = [3, 40]"))
    [batch] = [d for d in spec.shapes if d.name == "batch"]
    assert batch.values == (3, 4, 8, 16, 32, 40) and batch.range == (3, 40)


def test_a_refine_budget_of_points_must_be_whole() -> None:
    with pytest.raises(SpecError, match=r"search\.refine_budget"):
        _spec("[search]\nrefine_budget = 2.5\n")


def test_refined_work_is_missing_items_until_every_level_is_measured() -> None:
    spec = _spec()
    stopped = work_of(spec)
    drive(stopped, stop_after=10)
    assert stopped.missing() > 0
    done = work_of(spec)
    records = drive(done)
    assert done.missing() == 0
    assert len(batches(records)) > len(spec.shapes[0].values), "refinement planned points of its own"


SHORTLIST = "[search]\nrefine_shortlist = 1\n"
MANY = SPEC.replace("per_batch_ms = 0.05", "per_batch_ms = [0.05, 0.06, 0.2, 0.5]")


def test_a_shortlisted_refined_point_measures_the_default_and_its_neighbours_fastest() -> None:
    spec = _spec(SHORTLIST, base=MANY)
    records = drive(work_of(spec))
    configs: dict[int, set[str]] = {}
    for r in records:
        configs.setdefault(dict(r.shape)["batch"], set()).add(r.config_key)
    [default] = {r.config_key for r in records if r.is_default}
    [fastest] = {r.config_key for r in records if dict(r.config)["per_batch_ms"] == 0.05}
    assert all(len(configs[b]) == 5 for b in (1, 8, 64))  # the starting grid: every config
    refined_batches = set(configs) - {1, 8, 64}
    assert refined_batches
    for b in refined_batches:  # the neighbours' fastest is per_batch 0.05 or the default
        assert configs[b] <= {default, fastest}, (b, configs[b])
        assert default in configs[b]
    # fewer measurements than every config at every point, and the breakpoint is still closed in on
    tuned = sorted(configs)
    assert min(b for b in tuned if b > 20) - max(b for b in tuned if b < 20) <= 4, tuned
    everything = drive(work_of(_spec(base=MANY)))
    assert batches(everything) == tuned
    assert len(records) < len(everything)


def test_a_resumed_shortlisted_refinement_plans_the_same_items() -> None:
    spec = _spec(SHORTLIST, base=MANY)
    whole = drive(work_of(spec))
    for stop in (5, 20, len(whole) // 2):
        resumed = drive(work_of(spec), records=drive(work_of(spec), stop_after=stop))
        ids = Counter(r.item_id for r in resumed)
        assert max(ids.values()) == 1 and set(ids) == {r.item_id for r in whole}


def test_fastest_ranks_each_config_by_its_highest_fidelity_look() -> None:
    from tunectl.core.record import Phase
    from tunectl.decide.refine import fastest
    from tunectl.decide.search import Point

    a, b, c = (make_key({"per_batch_ms": x}) for x in (0.1, 0.2, 0.3))
    point = Point(make_key({}), make_key({"batch": 8}), (a, b, c))

    def rec(iid: str, config: Key, us: float, phase: Phase, at: float, ok: bool = True) -> None:
        point.records[iid] = Record(run_id="r", item_id=iid, task="cost_model", static_key="{}",
                                    shape_key=key_text(point.shape), config_key=key_text(config),
                                    is_default=config == a, status="ok" if ok else "error",
                                    median_us=us, phase=phase, finished_at=at)  # fmt: skip

    rec("a1", a, 300.0, Phase.MEASURE, at=1.0)  # a's full measurement, then a quick look that read fast
    rec("a0", a, 50.0, Phase.SCREEN, at=2.0)
    rec("b1", b, 100.0, Phase.SCREEN, at=4.0)  # b's later look counts over its first
    rec("b0", b, 200.0, Phase.SCREEN, at=3.0)
    rec("c0", c, 10.0, Phase.SCREEN, at=5.0, ok=False)  # a failed look never ranks
    assert fastest(point, 2, lambda s, cfg: True) == [b, a]
    assert fastest(point, 1, lambda s, cfg: cfg != b) == [a]


def test_a_refine_shortlist_must_be_a_whole_number() -> None:
    with pytest.raises(SpecError, match="refine_shortlist"):
        _spec("[search]\nrefine_shortlist = 1.5\n")


def test_line_neighbours_are_the_nearest_on_each_side_with_the_other_values_equal() -> None:
    from tunectl.core.shapes import line_neighbours

    grid = [make_key({"batch": b, "kv_len": k, "mask": "causal"}) for b in (1, 4, 16) for k in (1024, 8192)]
    grid.append(make_key({"batch": 8, "kv_len": 1024, "mask": "full"}))  # another mask: never a neighbour
    here = make_key({"batch": 8, "kv_len": 1024, "mask": "causal"})
    found = [(dict(s)["batch"], dict(s)["kv_len"]) for s in line_neighbours(here, grid)]
    assert found == [(4, 1024), (16, 1024)]  # no batch-8 causal point at another length
    assert [(dict(s)["batch"], dict(s)["kv_len"]) for s in line_neighbours(here, grid, ["batch"])] == [
        (4, 1024), (16, 1024)]  # fmt: skip
    at_edge = make_key({"batch": 16, "kv_len": 8192, "mask": "causal"})
    assert [(dict(s)["batch"], dict(s)["kv_len"]) for s in line_neighbours(at_edge, grid)] == [
        (4, 8192), (16, 1024)]  # fmt: skip
