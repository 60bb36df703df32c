"""Racing in a comparison's interleaved rounds: an arm clearly behind the fastest in every one of its
first rounds is timed no further, the baseline always to the end, and its record says how many rounds
it had. The rule and the runner are real; the kernels are the cost model's simulated calls (each
reports a fixed cost), so which arm is behind is known exactly."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from tunectl.core.keys import make_key
from tunectl.core.plan import comparison
from tunectl.core.record import Phase, Record, Status
from tunectl.core.spec import MeasureSpec
from tunectl.measure.harness import interleave
from tunectl.measure.rounds import RACE_AFTER, RACE_MARGIN, arm_stats, racing
from tunectl.measure.runner import ItemRunner
from tunectl.tasks.cost_model import SIMULATED_ENV

SETTINGS = MeasureSpec(warmup=0, min_samples=3, max_samples=6, noise_target=0.0, drift="off")


def _fixed(per_round: list[float]) -> Callable[[], float]:
    """A sampler reading ``per_round[r]`` in round r (3 samples a round; the last value after them)."""
    calls = [0]

    def sample() -> float:
        calls[0] += 1
        return per_round[min((calls[0] - 1) // 3, len(per_round) - 1)]

    return sample


def test_an_arm_behind_in_every_round_is_retired_after_the_first_rounds() -> None:
    steady = {"baseline": 100.0, "fast": 90.0, "slow": 200.0, "close": 93.0}  # close: 3.3 % behind
    samplers = [_fixed([us]) for us in steady.values()]
    settings = MeasureSpec(warmup=0, min_samples=3, max_samples=3, noise_target=0.0, max_seconds=10.0)
    rounds = interleave(samplers, 8, settings, seed=1, retire=racing())
    assert [len(r) for r in rounds] == [8, 8, RACE_AFTER, 8], "the baseline (11 % behind) is kept"
    assert all(len(r) == 8 for r in interleave(samplers, 8, settings, seed=1)), "no rule: every round"


def test_an_arm_that_led_or_came_close_in_one_round_keeps_running() -> None:
    behind = 1 + 2 * RACE_MARGIN
    wobbly = [100.0 * behind, 100.0] + [100.0 * behind] * 6  # level with the fastest in round 2
    samplers = [_fixed([120.0]), _fixed([100.0]), _fixed(wobbly), _fixed([100.0 * behind])]
    settings = MeasureSpec(warmup=0, min_samples=3, max_samples=3, noise_target=0.0, max_seconds=10.0)
    rounds = interleave(samplers, 8, settings, seed=3, retire=racing())
    assert [len(r) for r in rounds][:3] == [8, 8, 8]
    assert len(rounds[3]) == RACE_AFTER


def _compare(monkeypatch: pytest.MonkeyPatch, phase: Phase) -> list[Record]:
    monkeypatch.setenv(SIMULATED_ENV, "1")
    arms = tuple(make_key({"fixed_ms": ms}) for ms in (1.0, 0.5, 2.0, 0.51))  # the default first
    static, shape = make_key({"capacity": 1 << 20}), make_key({"batch": 8, "kv_len": 2048})
    item = comparison("cost_model", static, shape, arms, phase, rounds=8)
    records = ItemRunner("cpu").run("r", item, SETTINGS)
    assert all(r.status is Status.OK for r in records), [r.message for r in records]
    return records


def test_finals_and_probes_race_but_held_out_shapes_time_every_arm_in_every_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for phase in (Phase.FINAL, Phase.PROBE):
        records = _compare(monkeypatch, phase)
        assert [r.rounds for r in records] == [8, 8, RACE_AFTER, 8], phase
        slow = records[2]
        assert slow.speedup == pytest.approx(0.5, rel=0.02) and slow.speedup_hi < 1.0
        assert records[1].speedup == pytest.approx(2.0, rel=0.02)
    assert [r.rounds for r in _compare(monkeypatch, Phase.HOLDOUT)] == [8, 8, 8, 8]


def test_an_arms_mean_weighs_each_round_by_its_samples() -> None:
    """A round slowed by a neighbour stops early on its time cap: its few samples must not weigh as
    much as a quiet round's in the mean (num_samples x mean is the kernel time the samples took),
    while the median and noise stay the rounds' own."""
    rounds = [[10.0] * 9, [100.0], [10.0] * 9]
    arm = arm_stats([20.0, 20.0, 20.0], [10.0, 100.0, 10.0], rounds)
    assert arm.stats.num_samples == 19
    assert math.isclose(arm.stats.mean_us * arm.stats.num_samples, 9 * 10.0 + 100.0 + 9 * 10.0)
    assert arm.stats.median_us == 10.0 and arm.stats.max_us == 100.0
    retired = arm_stats([20.0, 20.0, 20.0], [10.0, 100.0], rounds[:2])  # timed in two rounds only
    assert (retired.stats.num_samples, retired.speedup.rounds) == (10, 2)
    assert math.isclose(retired.stats.mean_us, (9 * 10.0 + 100.0) / 10)
