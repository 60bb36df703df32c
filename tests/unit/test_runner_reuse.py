"""A config's kernel, check and sampler are built once per point and reused by its later looks and its
finals, also after the worker measured other points in between (it keeps its last few points while
the device has memory for them); a point it let go is built again. The task and the samplers are real
(CPU); the counters only watch them, and the device's memory is faked."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tunectl.core.keys import make_key
from tunectl.core.plan import WorkItem, comparison, item_id
from tunectl.core.record import Phase, Record, Status
from tunectl.core.spec import MeasureSpec
from tunectl.measure import runner as runner_module
from tunectl.measure.runner import ItemRunner

SETTINGS = MeasureSpec(warmup=2, min_samples=3, max_samples=5, max_seconds=0.2, drift="off")
STATIC = make_key({})
GOOD, FAST = make_key({"fault": "none"}), make_key({"fault": "none", "variant": 1})


def _look(shape: Any, config: Any, rung: int, budget: float) -> WorkItem:
    iid = item_id("fault_injection", STATIC, shape, config, make_key({"rung": rung, "budget": budget}))
    return WorkItem(iid, "fault_injection", STATIC, shape, config, config == GOOD, Phase.SCREEN, rung, budget)


class Counted:
    """Counts the calls of a real function it passes through."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.fn(*args, **kwargs)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, Counted]:
    made = Counted(runner_module.make_sampler)
    prepared = Counted(runner_module.timed_prepare)
    monkeypatch.setattr(runner_module, "make_sampler", made)
    monkeypatch.setattr(runner_module, "timed_prepare", prepared)
    return {"samplers": made, "prepares": prepared}


def _ok(records: list[Record]) -> list[Record]:
    assert all(r.status is Status.OK for r in records), [r.message for r in records]
    return records


def test_rungs_and_finals_at_one_point_build_each_config_once(counted: dict[str, Counted]) -> None:
    runner, shape = ItemRunner("cpu"), make_key({"n": 64})
    for rung, budget in ((0, 0.25), (1, 0.5)):
        for config in (GOOD, FAST):
            _ok(runner.run("r", _look(shape, config, rung, budget), SETTINGS))
    finals = comparison("fault_injection", STATIC, shape, (GOOD, FAST), Phase.FINAL, rounds=3)
    _ok(runner.run("r", finals, SETTINGS))
    assert counted["samplers"].calls == 2, "one sampler per config, whatever the number of looks"
    assert counted["prepares"].calls == 2, "each config loaded and checked once at the point"


def test_a_later_look_carries_the_first_checks_error_and_loads_nothing(counted: dict[str, Counted]) -> None:
    runner, shape = ItemRunner("cpu"), make_key({"n": 64})
    [first] = _ok(runner.run("r", _look(shape, FAST, 0, 0.25), SETTINGS))
    [later] = _ok(runner.run("r", _look(shape, FAST, 1, 0.5), SETTINGS))
    assert later.max_abs_err == first.max_abs_err and later.compile_ms == 0.0


def _visit(runner: ItemRunner, sizes: tuple[int, ...]) -> list[Record]:
    return [_ok(runner.run("r", _look(make_key({"n": n}), GOOD, 0, 0.25), SETTINGS))[0] for n in sizes]


def test_a_point_the_worker_comes_back_to_is_not_built_again(counted: dict[str, Counted]) -> None:
    runner = ItemRunner("cpu")
    first, _, again = _visit(runner, (64, 128, 64))
    assert counted["samplers"].calls == 2 and counted["prepares"].calls == 2, "64's config reused"
    assert again.compile_ms == 0.0 and again.max_abs_err == first.max_abs_err
    assert again.setup_ms is not None and first.setup_ms is not None and again.setup_ms < first.setup_ms


def test_past_the_points_it_keeps_the_oldest_is_built_again(counted: dict[str, Counted]) -> None:
    runner = ItemRunner("cpu")
    runner._points.keep = 2
    _visit(runner, (64, 128, 256, 128, 64))
    assert counted["samplers"].calls == 4, "128 was kept (newest of two), 64 was let go for 256"


def test_a_device_short_of_memory_keeps_only_the_point_it_is_at(counted: dict[str, Counted]) -> None:
    runner = ItemRunner("cpu")
    runner._points.short_of_memory = lambda: True
    _visit(runner, (64, 128, 64))
    assert counted["samplers"].calls == 3 and len(runner._points) == 1


def test_a_reused_sampler_is_not_warmed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[int] = []
    real = runner_module.make_sampler

    def counting(*args: Any, **kwargs: Any) -> Any:
        sample = real(*args, **kwargs)

        def counted() -> float:
            taken.append(1)
            return sample()

        return counted

    monkeypatch.setattr(runner_module, "make_sampler", counting)
    runner, shape = ItemRunner("cpu"), make_key({"n": 64})
    fixed = dataclasses.replace(SETTINGS, min_samples=3, max_samples=3)
    [first] = _ok(runner.run("r", _look(shape, GOOD, 0, 1.0), fixed))
    num_first = len(taken)
    [second] = _ok(runner.run("r", _look(shape, GOOD, 1, 1.0), fixed))
    assert num_first == fixed.warmup + first.num_samples
    assert len(taken) - num_first == second.num_samples, "no warm-up samples the second time"


def test_a_batch_under_compile_ahead_prepares_each_member_while_the_one_before_it_is_checked() -> None:
    from tunectl.core.plan import batch
    from tunectl.orchestrator.pipeline import CompileAheadRunner

    runner, shape = CompileAheadRunner("cpu"), make_key({"n": 64})
    third = make_key({"fault": "none", "variant": 2})
    members = [_look(shape, config, 0, 0.25) for config in (GOOD, FAST, third)]
    runner.next_item = _look(shape, make_key({"fault": "none", "variant": 3}), 0, 0.25)
    records = _ok(runner.run("r", batch(members), SETTINGS))
    assert [r.item_id for r in records] == [m.item_id for m in members]
    assert runner.num_prepared_ahead == 2, "the second and third members were prepared ahead"
    assert set(runner._ahead) == {runner.next_item.item_id}, "then the next call's item"


def test_a_batch_is_timed_in_chunks_not_a_wait_per_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    from tunectl.core.plan import batch

    chunks: list[int] = []
    real = runner_module.make_sampler

    def chunking(*args: Any, **kwargs: Any) -> Any:
        sample = real(*args, **kwargs)

        def many(n: int) -> list[float]:
            chunks.append(n)
            return [sample() for _ in range(n)]

        sample.many = many  # type: ignore[attr-defined]  # a GPU sampler's chunks, on the CPU's clock
        return sample

    monkeypatch.setattr(runner_module, "make_sampler", chunking)
    fixed = dataclasses.replace(SETTINGS, warmup=0, min_samples=12, max_samples=12, max_seconds=10.0)
    shape = make_key({"n": 64})
    members = [_look(shape, config, 0, 1.0) for config in (GOOD, FAST)]
    records = _ok(ItemRunner("cpu").run("r", batch(members), fixed))
    assert [r.num_samples for r in records] == [12, 12]
    assert sum(chunks) == 24 and len(chunks) <= 4, "a first sample for the pace, then one chunk each"


def test_a_runner_that_let_go_builds_its_points_again(counted: dict[str, Counted]) -> None:
    """What a resident worker does between runs: the next run finds no point kept (their memory is
    the next run's), and measures as a new worker would."""
    runner = ItemRunner("cpu")
    _visit(runner, (64, 128))
    runner.let_go()
    again = _visit(runner, (64, 128))
    assert counted["samplers"].calls == 4 and counted["prepares"].calls == 4, "each point built again"
    assert all(r.setup_ms and r.setup_ms > 0 for r in again), "its inputs too"
