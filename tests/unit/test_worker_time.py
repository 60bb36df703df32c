"""Where each worker's time went, read from its rows (tunectl.report.worker_time), and the console's
lines at the end of a submit."""

from __future__ import annotations

import dataclasses
import math

from rich.console import Console

from tunectl.cli.submit import _print_worker_times
from tunectl.core.record import Phase, Record, Status
from tunectl.report.worker_time import WorkerTime, kernel_seconds, worker_times


def _row(worker: str, start: float, finish: float, **fields: object) -> Record:
    base = Record("r1", f"i{start}-{finish}", "t", "{}", "{}", "{}", False, Status.OK, worker=worker)
    return dataclasses.replace(base, started_at=start, finished_at=finish, **fields)  # type: ignore[arg-type]


def _rows() -> list[Record]:
    timed = {"num_samples": 10, "calls_per_sample": 4, "mean_us": 1000.0}
    return [
        # a batch of two looks, one call from t=100 to t=101
        _row("g0", 100.0, 100.5, compile_ms=200.0, setup_ms=100.0, measure_ms=150.0, guard_ms=50.0, **timed),
        _row("g0", 100.0, 101.0, compile_ms=100.0, measure_ms=250.0, guard_ms=50.0, **timed),
        # a comparison's two arms share one set-up and one measurement; the worker waited 2 s before it
        _row("g0", 103.0, 104.0, group_id="c1", phase=Phase.FINAL, setup_ms=10.0, measure_ms=800.0, **timed),
        _row("g0", 103.0, 104.0, group_id="c1", phase=Phase.FINAL, setup_ms=10.0, measure_ms=800.0, **timed),
        # a failed row: its time counts, its kernel does not
        _row("g0", 104.0, 104.5, status=Status.ERROR, compile_ms=400.0, mean_us=1000.0, num_samples=10),
        _row("g1", 100.0, 102.0, measure_ms=1500.0, **timed),
        _row("", 90.0, 110.0, status=Status.COMPILE_ERROR),  # recorded by the driver, in no worker's span
        _row("g1", 0.0, 0.0),  # written by a version that did not record when an item ran
    ]


def test_a_workers_span_splits_into_its_parts_with_calls_counted_once() -> None:
    g0, g1 = worker_times(_rows())
    assert (g0.worker, g1.worker) == ("g0", "g1")
    assert g0.span_s == 4.5 and g1.span_s == 2.0
    assert math.isclose(g0.loading_s, 0.7) and math.isclose(g0.setup_s, 0.11)
    assert math.isclose(g0.measuring_s, 1.2) and math.isclose(g0.guard_s, 0.1)
    assert math.isclose(g0.waiting_s, 2.0)  # 4.5 s of span, calls of 1 + 1 + 0.5 s
    assert math.isclose(g0.other_s, 4.5 - 0.7 - 0.11 - 1.2 - 2.0)
    one = (10 * 4 + 1) * 1e-3  # an ok row's samples and its checked call
    assert math.isclose(g0.kernel_s, 4 * one) and math.isclose(g0.busy, 4 * one / 4.5)
    assert math.isclose(kernel_seconds(_rows()[0], warmup=2), (12 * 4 + 1) * 1e-3)


def test_rows_before_since_are_left_out_and_summed_workers_add_up() -> None:
    (late,) = [t for t in worker_times(_rows(), since=103.0) if t.worker == "g0"]
    assert late.span_s == 1.5 and late.waiting_s == 0.0
    both = WorkerTime.summed(worker_times(_rows()), "2 workers together")
    assert both.span_s == 6.5 and math.isclose(both.measuring_s, 2.7)


def test_the_console_shows_each_worker_or_the_sum_and_the_least_busy() -> None:
    def printed(times: list[WorkerTime]) -> list[str]:
        console = Console(record=True, width=400)
        _print_worker_times(console, times)
        return console.export_text().splitlines()

    g0, g1 = worker_times(_rows())
    lines = printed([g0, g1])
    head = "g0: 4.5 s from first item to last, the tuned kernels running 4 % of it; measuring 1.2 s"
    assert lines[0].startswith(head + " (drift guard 0.1 s)")
    assert lines[0].endswith("waiting for work 2.0 s, other 0.5 s") and lines[1].startswith("g1: 2.0 s")
    console = Console(record=True, width=400)
    startup = {"total_s": 17.7, "libraries": {"flash_attn.cute": 7.0, "flashinfer": 2.5}}
    cpu = {"total_s": 3.0, "libraries": {}, "threads": 1}  # a CPU worker says what it times with
    _print_worker_times(console, [g0, g1], {"g0": startup, "g1": cpu})
    g0_line, g1_line = console.export_text().splitlines()
    assert g0_line.startswith("g0: started in 17.7 s (kernel libraries 9.5 s), then 4.5 s from first item")
    assert g1_line.startswith("g1: started in 3.0 s on 1 thread, then 2.0 s")
    many = [dataclasses.replace(g0, worker=f"c{i}") for i in range(5)] + [g1]
    lines = printed(many)
    assert len(lines) == 2 and lines[0].startswith("6 workers together: 24.5 s")
    least = "g1: 2.0 s from first item to last, the tuned kernels running 2 %"
    assert lines[1].startswith(least)
