"""A call's records built from what became of each config (``tunectl.measure.outcome``): every column,
for fixed inputs, as the results schema has them (``tests/data/outcome_records.json``: the rows the
same inputs gave when a call's records were assembled from field dicts), and which columns a worker
sets for each kind of outcome, through the runner."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tunectl.core.keys import make_key
from tunectl.core.plan import WorkItem, batch, comparison, item_id
from tunectl.core.record import Phase, Record, Status, Timing, TimingMethod
from tunectl.core.spec import MeasureSpec
from tunectl.measure.drift import Guarded
from tunectl.measure.harness import Stats
from tunectl.measure.nvml import GpuState, state_around
from tunectl.measure.outcome import CRASHED_ARM, NO_BASELINE, Check, Outcome, Timed, Verdict
from tunectl.measure.records import CallContext, Member, failed, measured
from tunectl.measure.rounds import arm_stats
from tunectl.measure.runner import ItemRunner

GOLDEN = Path(__file__).parents[1] / "data" / "outcome_records.json"
CONTEXT = CallContext(
    run_id="r1",
    task="fault_injection",
    static_key="{}",
    shape_key='{"n":64}',
    phase=Phase.SCREEN,
    rung=1,
    measure_mode=TimingMethod.GRAPH,
    timing=Timing.DIFFERENCE,
    l2="cold",
    bytes_moved=512,
    device_name="H200",
    device_kind="cuda",
    host="h",
    worker="h:1",
    env_json='{"torch":"2"}',
    started_at=5.0,
)
MEMBER = Member("i1", '{"fault":"none"}', True)
STATS = Stats(10.0, 9.5, 10.5, 10.1, 9.0, 12.0, 20, 0.05, 0.0123)
LOST = Stats(-0.1, -0.3, 0.2, -0.05, -0.4, 0.3, 40, float("inf"), 0.02)
GUARD = Guarded(STATS, 201.5, 1.01, False, 1, 0.0042)
BEFORE = GpuState(1980.0, 41.0, 410.0, 0x1, 10)
AFTER = GpuState(1965.0, 45.0, 402.5, 0x4, 12)
BASELINE, TIMES = [10.0, 11.0, 12.0], [5.0, 6.0, 5.5]
ROUNDS = [[5.0, 5.1], [6.0, 6.2], [5.5, 5.4]]


def _timed_guarded() -> Record:
    device = state_around(BEFORE, AFTER)
    outcome = Outcome(Check(1e-3, 12.5), setup_ms=3.25, device=device).measured((STATS, GUARD), 4)
    return measured(CONTEXT, MEMBER, outcome)


def _timed_again_unguarded() -> Record:
    return measured(CONTEXT, MEMBER, Outcome(Check(2e-4, 3.0).again()).measured((STATS, None), 1))


def _wrong_result() -> Record:
    return measured(CONTEXT, MEMBER, Outcome(Check(0.5, 7.0, (1e-2, 2e-2)), setup_ms=2.0))


def _not_measurable() -> Record:
    outcome = Outcome(Check(0.0, 1.5), device=state_around(None, AFTER))
    return measured(CONTEXT, MEMBER, outcome.measured((LOST, GUARD), 8))


def _measurement_raised() -> Record:
    outcome = Outcome(Check(0.0, 1.5), device=state_around(BEFORE, None))
    return measured(CONTEXT, MEMBER, outcome.failed(Verdict(Status.ERROR, "RuntimeError: boom")))


def _check_raised() -> Record:
    return measured(CONTEXT, MEMBER, Outcome(setup_ms=0.0, failure=Verdict(Status.INVALID, "BLOCK_N=24")))


def _arm_timed() -> Record:
    arm = arm_stats(BASELINE, TIMES, ROUNDS)
    timed = Timed(arm.stats, 3, 55.5)
    return measured(
        CONTEXT, MEMBER, Outcome(Check(1e-3, 9.0), setup_ms=1.0, timed=timed, speedup=arm.speedup)
    )


def _arm_not_compared() -> Record:
    return measured(CONTEXT, MEMBER, Outcome(Check(1e-3, 9.0), setup_ms=1.0).failed(NO_BASELINE))


def _arm_crashed() -> Record:
    return measured(CONTEXT, MEMBER, Outcome(setup_ms=1.0, failure=CRASHED_ARM))


def _no_answer() -> Record:
    return failed(CONTEXT, MEMBER, "timeout", "ran past its deadline")


BUILDS: dict[str, Callable[[], Record]] = {
    "timed_guarded": _timed_guarded,
    "timed_again_unguarded": _timed_again_unguarded,
    "wrong_result": _wrong_result,
    "not_measurable": _not_measurable,
    "measurement_raised": _measurement_raised,
    "check_raised": _check_raised,
    "arm_timed": _arm_timed,
    "arm_not_compared": _arm_not_compared,
    "arm_crashed": _arm_crashed,
    "no_answer": _no_answer,
}


def _row(record: Record) -> dict[str, Any]:
    """The record's columns as a file stores them, its finish time aside (the clock's)."""
    row = record.to_row()
    assert row.pop("finished_at") >= CONTEXT.started_at
    return row


@pytest.mark.parametrize("name", list(BUILDS))
def test_every_column_of_a_record_is_what_the_schema_had_for_the_same_outcome(name: str) -> None:
    expected = json.loads(GOLDEN.read_text(encoding="utf-8"))[name]
    row = _row(BUILDS[name]())
    assert list(row) == list(expected)
    assert {k: v for k, v in row.items() if v != expected[k]} == {}
    assert all(type(row[k]) is type(expected[k]) for k in row if expected[k] is not None), name


SETTINGS = MeasureSpec(warmup=1, min_samples=3, max_samples=5, max_seconds=0.2)
STATIC, SHAPE = make_key({}), make_key({"n": 64})
NONE, WRONG, RAISE = make_key({"fault": "none"}), make_key({"fault": "wrong"}), make_key({"fault": "raise"})
INVALID, FAST = make_key({"fault": "invalid"}), make_key({"fault": "none", "variant": 1})


def _look(config: Any) -> WorkItem:
    iid = item_id("fault_injection", STATIC, SHAPE, config, make_key({"rung": 0}))
    return WorkItem(iid, "fault_injection", STATIC, SHAPE, config, config == NONE, Phase.SCREEN, 0, 0.25)


def _set(record: Record) -> dict[str, Any]:
    """Which columns a record set, with its status and the first line of its message."""
    row = {k: v is not None and v != "" for k, v in record.to_row().items()}
    return {**row, "status": str(record.status), "message": record.message.split("\n")[0]}


def test_a_worker_sets_the_same_columns_for_each_outcome_as_before() -> None:
    runner = ItemRunner("cpu")
    looks = [
        batch([_look(NONE), _look(WRONG), _look(RAISE), _look(FAST)]),
        _look(FAST),  # a later look at the point: checked before, nothing set up or compiled
        comparison("fault_injection", STATIC, SHAPE, (NONE, INVALID, WRONG, FAST), Phase.FINAL, rounds=3),
        comparison("fault_injection", STATIC, SHAPE, (INVALID, FAST), Phase.FINAL, rounds=3),
    ]
    found = [_set(r) for item in looks for r in runner.run("r", item, SETTINGS)]
    again = runner.run("r", _look(FAST), SETTINGS)[0]
    assert (again.compile_ms, again.setup_ms) == (0.0, 0.0)
    expected = json.loads(GOLDEN.read_text(encoding="utf-8"))["worker"]
    assert [{k: v for k, v in f.items() if e[k] != v} for f, e in zip(found, expected, strict=True)] == [
        {} for _ in expected
    ]
