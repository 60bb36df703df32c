"""Interleaved comparisons in the worker, and validation planned from a bundle (end to end on a local
Ray instance: tests/integration/test_validate_on_ray.py).

Times come from the fault-injection task, whose configs sleep for what they say (``run_ms``): a
config that sleeps 1 ms per call is slower than the default's no-op beyond any noise.
"""

from __future__ import annotations

from typing import Any

from tunectl.core.keys import make_key
from tunectl.core.plan import comparison
from tunectl.core.record import Record
from tunectl.core.spec import MeasureSpec, parse_spec
from tunectl.decide.stacked import plan_validation
from tunectl.measure.runner import ItemRunner

FAST = MeasureSpec(warmup=0, min_samples=3, max_samples=6, max_seconds=0.05)
DEFAULT = make_key({"fault": "none"})
SLOW = make_key({"fault": "none", "run_ms": 1})
SHAPE = make_key({"n": 4})


def _compare(arms: tuple[Any, ...], phase: str = "final", layers: int = 0, rounds: int = 3) -> list[Record]:
    item = comparison("fault_injection", (), SHAPE, arms, phase, rounds=rounds, layers=layers)
    records = ItemRunner("cpu").run("r", item, FAST)
    assert isinstance(records, list)
    assert [r.item_id for r in records] == list(item.record_ids())
    assert {r.group_id for r in records} == {item.item_id} and all(r.rounds == rounds for r in records)
    return records


def test_finals_time_every_arm_in_rounds_and_pair_it_with_the_default() -> None:
    default, slow, wrong = _compare((DEFAULT, SLOW, make_key({"fault": "wrong"})))
    assert default.is_default and not slow.is_default and default.status == slow.status == "ok"
    assert default.speedup == 1.0 and default.speedup_lo == default.speedup_hi == 1.0
    assert slow.median_us is not None and slow.median_us >= 900  # a 1 ms sleep per call
    assert slow.speedup_hi is not None and slow.speedup_hi < 0.1, "1000x slower, beyond any noise"
    assert slow.speedup_lo is not None and slow.speedup_lo <= slow.speedup <= slow.speedup_hi
    assert slow.num_samples is not None and slow.num_samples >= 3 * 3
    assert wrong.status == "wrong_result" and wrong.speedup is None, "a wrong config is never timed"


def test_without_a_working_default_nothing_is_compared() -> None:
    broken, other = _compare((make_key({"fault": "wrong"}), SLOW))
    assert broken.status == "wrong_result"
    assert other.status == "error" and "default failed" in other.message


def test_a_stack_times_each_call_per_layer() -> None:
    # six rounds: one round slowed by a busy machine (a 2-core CI box) must not widen the interval past
    # what the assertions allow
    default, slow = _compare((DEFAULT, SLOW), phase="validate", layers=3, rounds=6)
    assert default.layers == slow.layers == 3 and slow.phase == "validate"
    assert slow.median_us is not None and slow.median_us >= 900, "per layer: one 1 ms sleep, never shorter"
    assert slow.speedup is not None and slow.speedup < 0.1, "a 1 ms call against a no-op"
    assert slow.speedup_hi is not None and slow.speedup_hi < 0.5


class _Bundle:
    def __init__(self, by_n: dict[int, dict[str, Any] | None]) -> None:
        self.by_n = by_n

    def lookup(self, task: str, **params: Any) -> dict[str, Any] | None:
        return self.by_n.get(params["n"])


SPEC = 'name = "v"\ntask = "fault_injection"\n[shapes.n]\nvalues = [1, 2, 4]\n[configs]\nrun_ms = [1]\n'


def test_validation_plans_a_comparison_where_the_bundle_left_the_default() -> None:
    spec = parse_spec(SPEC)
    bundle = _Bundle({1: None, 2: {"fault": "none"}, 4: {"fault": "none", "run_ms": 1}})
    items, skipped = plan_validation(spec, bundle, layers=5, rounds=4)
    [item] = items
    assert item.arms == (DEFAULT, SLOW) and item.layers == 5 and item.rounds == 4 and item.phase == "validate"
    assert dict(item.shape) == {"n": 4}
    assert sorted((dict(s.shape)["n"], s.why) for s in skipped) == [
        (1, "the bundle has no entry here"),
        (2, "the bundle keeps the default here"),
    ]
