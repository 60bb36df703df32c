"""Figures of one run's rows (benchmarks/gpu/throughput.py): the workers' calls, by phase."""

from __future__ import annotations

from benchmarks.gpu import throughput


def _row(worker: str, phase: str, start: float, finish: float) -> dict[str, object]:
    return {"worker": worker, "phase": phase, "started_at": start, "finished_at": finish}


def test_a_call_counts_once_to_its_last_row_and_driver_rows_not_at_all() -> None:
    rows = [
        _row("w0", "screen", 0.0, 0.5),  # a batch of three looks: one call from 0 to 1.5
        _row("w0", "screen", 0.0, 1.0),
        _row("w0", "screen", 0.0, 1.5),
        _row("w0", "final", 2.0, 4.0),  # a comparison's two arms: one call of 2 s
        _row("w0", "final", 2.0, 4.0),
        _row("w1", "probe", 2.0, 2.5),  # another worker's call at the same start is its own
        _row("", "screen", 0.0, 9.0),  # a kernel that did not build: recorded by the driver
    ]
    assert throughput.calls_by_phase_s(rows) == {"screen": 1.5, "final": 2.0, "probe": 0.5}


def test_a_return_counts_the_other_points_a_worker_measured_since_it_left() -> None:
    def call(worker: str, start: float, shape: str) -> dict[str, object]:
        return {"worker": worker, "started_at": start, "static_key": "s", "shape_key": shape}

    rows = [
        call("w0", 0.0, "a"),
        call("w0", 0.0, "a"),  # a batch: one call
        call("w0", 1.0, "b"),
        call("w0", 2.0, "c"),
        call("w0", 3.0, "b"),  # back to b after 1 other point (c)
        call("w0", 4.0, "a"),  # back to a after 2 others (b, c)
        call("w0", 5.0, "a"),  # stayed: not a return
        call("w1", 2.5, "a"),  # another worker's calls are its own
        call("", 9.0, "b"),  # the driver's row
    ]
    assert throughput.returns(rows) == {1: 1, 2: 1}
