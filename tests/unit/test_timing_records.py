"""How each row was timed, and what its drift guard saw: recorded, persisted, and respected by selection."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from tunectl.core.errors import SpecError
from tunectl.core.keys import key_text, make_key
from tunectl.core.plan import WorkItem
from tunectl.core.record import Record, Status, Timing
from tunectl.core.spec import MeasureSpec, parse_spec
from tunectl.decide.select import select_winners
from tunectl.measure.drift import CHECK_SETTINGS, LEVEL_SETTINGS
from tunectl.measure.reference import MakeReference, Reference
from tunectl.measure.runner import ItemRunner
from tunectl.store.results import ResultsWriter, read_results

FAST = MeasureSpec(warmup=0, min_samples=3, max_samples=6, max_seconds=0.05)
SHAPE = make_key({"n": 4})


def _record(config: str, median: float, *, timing: Timing, finished: float, default: bool = False) -> Record:
    return Record(
        run_id=f"r{int(finished)}", item_id=f"{config}-{timing}", task="t", static_key='{"d":1}',
        shape_key='{"batch":1}', config_key=config, is_default=default, status=Status.OK,
        median_us=median, p20_us=median, p80_us=median, rel_noise=0.01, num_samples=10,
        device_name="H200", timing=timing, finished_at=finished,
    )  # fmt: skip


def test_selection_compares_only_rows_of_the_method_of_the_points_latest_row() -> None:
    # Replay reads ~5 µs high: its 14 µs config against the difference method's 15 µs default is no
    # comparison. Measured again by the difference method (the default only, so far), the point is
    # decided by those rows alone.
    old = [
        _record('{"c":"a"}', 14.0, timing=Timing.REPLAY, finished=1.0),
        _record('{"c":"d"}', 20.0, timing=Timing.REPLAY, finished=1.0, default=True),
    ]
    new = [_record('{"c":"d"}', 15.0, timing=Timing.DIFFERENCE, finished=2.0, default=True)]
    [winner] = select_winners(old + new)
    assert winner.is_default and winner.median_us == 15.0 and winner.num_configs == 1
    # Where replay rows are the latest, they alone decide, and their own default is the baseline.
    later = [dataclasses.replace(r, finished_at=3.0) for r in old]
    [winner] = select_winners(new + later)
    assert dict(winner.config) == {"c": "a"} and winner.default_median_us == 20.0


def test_the_timing_method_and_drift_fields_survive_parquet(tmp_path: Path) -> None:
    record = dataclasses.replace(
        _record('{"c":"a"}', 9.5, timing=Timing.DIFFERENCE, finished=5.0),
        reference_us=201.5, reference_ratio=1.21, drift=True, remeasured=2, throttle_reasons=0x4,
        setup_ms=12.5, measure_ms=40.0, guard_ms=9.0,
    )  # fmt: skip
    writer = ResultsWriter(tmp_path)
    writer.append(record)
    writer.close()
    [back] = read_results(tmp_path)
    assert back.timing is Timing.DIFFERENCE and back.to_row()["timing"] == "difference"
    assert (back.reference_us, back.reference_ratio, back.drift, back.remeasured) == (201.5, 1.21, True, 2)
    assert back.throttle_reasons == 0x4
    assert (back.setup_ms, back.measure_ms, back.guard_ms) == (12.5, 40.0, 9.0)


def test_a_row_without_a_timing_reads_as_replay() -> None:
    row = _record('{"c":"a"}', 9.5, timing=Timing.DIFFERENCE, finished=5.0).to_row()
    assert Record.from_row({**row, "timing": None}).timing is Timing.REPLAY
    assert Record.from_row({k: v for k, v in row.items() if k != "timing"}).timing is Timing.REPLAY
    with pytest.raises(ValueError, match="timing 'bogus'"):
        Record.from_row({**row, "timing": "bogus"})


def _shifting_reference(slow_calls: range) -> MakeReference:
    """A reference whose device reads 20 % slow during the given samples (fake timing, real guard),
    per call whatever the window."""
    calls = 0

    def sample() -> float:
        nonlocal calls
        calls += 1
        return 120.0 if calls in slow_calls else 100.0

    return lambda device: lambda window_calls: sample


def _measure_item(runner: ItemRunner, settings: MeasureSpec) -> Record:
    config = make_key({"fault": "none", "run_ms": 1})
    item = WorkItem(key_text(config), "fault_injection", (), SHAPE, config, is_default=False)
    [record] = runner.run("r", item, settings)
    assert isinstance(record, Record) and record.ok, record
    return record


def test_a_worker_measures_again_when_its_reference_moved_and_records_what_it_saw() -> None:
    # steady samples stop at the minimum
    level = LEVEL_SETTINGS.warmup + LEVEL_SETTINGS.min_samples
    check = CHECK_SETTINGS.warmup + CHECK_SETTINGS.min_samples
    # The reference's level is steady; the check after the first measurement reads 20 % slow.
    runner = ItemRunner("cpu", reference=_shifting_reference(range(level + 1, level + check + 1)))
    record = _measure_item(runner, FAST)
    assert record.timing is Timing.REPLAY  # a CPU clock: nothing fixed per sample to take out
    assert record.calls_per_sample == 1  # a CPU sample times one call
    assert (record.remeasured, record.drift) == (1, False)
    assert (record.reference_us, record.reference_ratio) == (100.0, 1.0)


def test_a_worker_without_the_guard_times_no_reference() -> None:
    runner = ItemRunner("cpu", reference=_shifting_reference(range(0)))
    record = _measure_item(runner, dataclasses.replace(FAST, drift="off"))
    assert (record.reference_us, record.reference_ratio, record.drift, record.remeasured) == (None,) * 4


@pytest.mark.parametrize(("key", "value"), [("timing", "events"), ("drift", "ignore")])
def test_a_spec_names_a_bad_timing_or_drift_choice(key: str, value: str) -> None:
    text = "\n".join(
        ['task = "fault_injection"', "[shapes.n]", "values = [4]", "[configs]", 'fault = ["none"]',
         "[measure]", f'{key} = "{value}"']
    )  # fmt: skip
    with pytest.raises(SpecError, match=rf"measure\.{key}"):
        parse_spec(text)


def test_a_reference_that_cannot_be_built_leaves_the_measurement_unguarded() -> None:
    def no_reference(device: str) -> Reference:
        raise RuntimeError("out of memory")

    runner = ItemRunner("cpu", reference=no_reference)
    first, second = _measure_item(runner, FAST), _measure_item(runner, FAST)
    assert first.reference_us is None and second.reference_us is None  # ok rows, tried once, not per item


def _slow_reference(sleep_s: float) -> MakeReference:
    """A steady reference whose every sample takes ``sleep_s`` of real time."""

    def sample() -> float:
        time.sleep(sleep_s)
        return 100.0

    return lambda device: lambda window_calls: sample


def test_a_row_says_where_its_worker_spent_the_item(monkeypatch: pytest.MonkeyPatch) -> None:
    """Setting up the point (first item there only), the measurement's wall time, and the guard's share
    of it, each at least what the fakes spent in them (real sleeps)."""
    runner = ItemRunner("cpu", reference=_slow_reference(0.002))
    task = runner._task("fault_injection")
    build = task.build_inputs

    def slow_build(*args: object) -> object:
        time.sleep(0.03)
        return build(*args)

    monkeypatch.setattr(task, "build_inputs", slow_build)
    first, second = _measure_item(runner, FAST), _measure_item(runner, FAST)
    assert first.setup_ms is not None and first.setup_ms >= 30.0
    assert second.setup_ms == 0.0  # the same point: its inputs were kept
    per_check = CHECK_SETTINGS.warmup + CHECK_SETTINGS.min_samples
    # the first item: the point's level before, a check after; the second: a check after (the
    # first's, a few milliseconds old, is its check before); 2 ms a sample of the reference
    for record, checks in ((first, 2), (second, 1)):
        assert record.measure_ms is not None and record.guard_ms is not None and record.num_samples
        assert record.guard_ms >= checks * per_check * 2.0 * 0.9
        assert record.measure_ms >= record.guard_ms + record.num_samples * 1.0  # 1 ms kernel calls
        assert record.measure_ms <= (record.finished_at - record.started_at) * 1e3
