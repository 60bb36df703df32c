"""The driver itself stops mid-run (SIGKILL, SIGINT, or `tunectl cancel`): the run is never recorded
finished with an item missing, and `submit --resume` finishes it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.integration.test_faults import assert_one_row_per_item, planned_ids, raw_row_count, write_spec
from tunectl.cli import app
from tunectl.cli.progress import stopped_message
from tunectl.core.plan import WorkItem, plan
from tunectl.core.record import Record
from tunectl.core.spec import load_spec
from tunectl.decide.work import FixedItems
from tunectl.orchestrator.submit import IncompleteRun, RunOptions, RunStopped, new_run, run, submit
from tunectl.store.runs import list_runs, load_run, summarise_runs

pytestmark = pytest.mark.slow

#: 31 items of at least 150 ms each, in calls of 4 (rows come back every ~0.6 s): the run outlasts the
#: writer's first part (written after 2 s) by seconds, so a kill after the first rows lands mid-run
#: however fast the guard lets items pass
SLOW = '[[configs]]\nfault = "none"\nrun_ms = 150\nvariant = [' + ", ".join(map(str, range(30))) + "]\n"
IN_CALLS_OF_4 = {"resources": "batch = 4"}


@contextlib.contextmanager
def driver(*args: str) -> Iterator[subprocess.Popen[str]]:
    """`tunectl ARGS` in a session of its own; whatever it started is killed when the test is done.

    The driver takes SIGINT as from a terminal even where the tests run as a background job: such a
    job ignores SIGINT, every process it starts inherits that, and a SIGINT sent would do nothing."""
    with _sigint_not_ignored():
        proc = subprocess.Popen(
            [sys.executable, "-m", "tunectl", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
        )  # fmt: skip
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the Ray processes this driver started
        proc.wait()


@contextlib.contextmanager
def _sigint_not_ignored() -> Iterator[None]:
    """While the block runs, SIGINT is caught rather than ignored here: a process started now begins
    with SIGINT at its default (an ignored signal stays ignored across exec, a caught one does not)."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def wait_for_rows(results: Path, timeout_s: float = 60.0) -> str:
    """The run id, once the run has written some rows."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = list_runs(results) if results.exists() else []
        if runs and list(results.glob("task=*/run_id=*/part-*.parquet")):
            return runs[0].run_id
        time.sleep(0.1)
    raise AssertionError("the run wrote nothing in time")


def resume(results: Path, run_id: str) -> str:
    with driver("submit", "--resume", run_id, "--results", str(results)) as proc:
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return out


def test_a_driver_killed_mid_run_leaves_what_it_wrote_and_resume_finishes_the_run(tmp_path: Path) -> None:
    spec, results = write_spec(tmp_path, SLOW, **IN_CALLS_OF_4), tmp_path / "results"
    with driver("submit", str(spec), "--results", str(results)) as proc:
        run_id = wait_for_rows(results)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    (summary,) = summarise_runs(results)
    assert summary.state == "interrupted", "a running run whose driver is gone reads as interrupted"
    assert 0 < summary.num_done < len(planned_ids(spec))

    assert "already measured" in resume(results, run_id)
    assert_one_row_per_item(results, run_id, planned_ids(spec))
    (summary,) = summarise_runs(results)
    assert (summary.state, summary.num_done, summary.info.num_planned) == ("finished", 31, 31)


def test_a_sigint_stops_the_driver_early_and_resume_finishes_the_run(tmp_path: Path) -> None:
    spec, results = write_spec(tmp_path, SLOW, **IN_CALLS_OF_4), tmp_path / "results"
    # As when the tests run as a background job: SIGINT ignored here, and by whatever starts from here
    # unless the harness gives the driver its SIGINT back.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with driver("submit", str(spec), "--results", str(results)) as proc:
            run_id = wait_for_rows(results)
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert proc.returncode == 130, out
    assert f"run {run_id} stopped (interrupted)" in out and "Traceback" not in out

    (summary,) = summarise_runs(results)
    assert summary.state == "interrupted", "stopped early: not finished"
    assert summary.info.pools, "the pools the run placed are kept for its resume"
    assert 0 < summary.num_done < len(planned_ids(spec))
    assert "already measured" in resume(results, run_id)
    assert_one_row_per_item(results, run_id, planned_ids(spec))
    assert load_run(results, run_id).state == "finished"


def test_cancel_stops_a_local_run_cleanly_and_resume_finishes_it(tmp_path: Path) -> None:
    spec, results = write_spec(tmp_path, SLOW, **IN_CALLS_OF_4), tmp_path / "results"
    with driver("submit", str(spec), "--results", str(results)) as proc:
        run_id = wait_for_rows(results)
        cancelled = CliRunner().invoke(app, ["cancel", run_id, "--results", str(results)])
        out, _ = proc.communicate(timeout=30)
    assert cancelled.exit_code == 0, cancelled.output
    assert "stopped: cancelled" in cancelled.output
    assert proc.returncode == 130 and "Traceback" not in out

    listed = CliRunner().invoke(app, ["runs", "--results", str(results)], env={"COLUMNS": "200"})
    assert "cancelled" in listed.output
    resume(results, run_id)
    assert_one_row_per_item(results, run_id, planned_ids(spec))


def test_a_driver_killed_while_compile_processes_build_resumes_to_one_row_per_item(tmp_path: Path) -> None:
    configs = (
        '[[configs]]\nfault = "none"\nrun_ms = 40\ncompile_ms = 300\nvariant = ['
        + ", ".join(map(str, range(12)))
        + "]\n"
    )
    spec, results = write_spec(tmp_path, configs, n=(4, 8)), tmp_path / "results"
    build = ["--num-gpus", "2", "--compile-workers", "1", "--compile-cache", str(tmp_path / "cache")]
    with driver("submit", str(spec), "--results", str(results), *build) as proc:
        run_id = wait_for_rows(results)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (summary,) = summarise_runs(results)
    assert 0 < summary.num_done < len(planned_ids(spec)), "killed with kernels still to build"

    with driver("submit", "--resume", run_id, "--results", str(results), *build) as proc:
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    rows = assert_one_row_per_item(results, run_id, planned_ids(spec))
    assert {r.status for r in rows} == {"ok"}


class _LosesAnItem(FixedItems):
    """Fixed work with a fault on the driver's side: the first item it hands out never reaches a worker."""

    def __init__(self, items: list[WorkItem], pool: str | None) -> None:
        super().__init__(items, pool)
        self.lost: WorkItem | None = None

    def draw(self, limit: int) -> list[WorkItem]:
        items = super().draw(limit)
        if items and self.lost is None:
            self.lost = items.pop(0)
        return items


def test_a_run_whose_dispatch_ends_with_an_item_missing_is_not_finished_and_resume_completes_it(
    ray_two_gpus: None, tmp_path: Path
) -> None:
    path, results = write_spec(tmp_path, '[[configs]]\nfault = "none"\nvariant = [0, 1, 2]\n'), tmp_path / "r"
    spec = load_spec(path)
    items = list(plan(spec).work_items())
    info = new_run(spec, results=results, num_planned=len(items))
    with pytest.raises(IncompleteRun, match=rf"run {info.run_id} ended with 1 item\(s\) still without a row"):
        run(lambda pool: _LosesAnItem(items, pool), spec.resources, spec.measure, results=results, info=info,
            options=RunOptions(num_gpus=1))  # fmt: skip
    stopped = load_run(results, info.run_id)
    assert stopped.state == "failed" and "IncompleteRun" in stopped.message
    assert raw_row_count(results, info.run_id) == len(items) - 1

    out = submit(None, results, resume=info.run_id)
    assert out.num_skipped_done == len(items) - 1
    assert_one_row_per_item(results, info.run_id, planned_ids(path))
    assert load_run(results, info.run_id).state == "finished"


class _InterruptedAt:
    """A run's progress, where a Ctrl-C lands in the driver once ``n`` records have come."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def start(self, run_id: str, total: int, placement: object) -> None:
        pass

    def record(self, record: Record) -> None:
        self.seen += 1
        if self.seen == self.n:
            raise KeyboardInterrupt

    def compiles(self, built: int, total: int, building: int) -> None:
        pass


def test_a_run_interrupted_at_its_third_record_keeps_its_pools_and_resume_completes_it(
    ray_two_gpus: None, tmp_path: Path
) -> None:
    spec, results = write_spec(tmp_path, SLOW, **IN_CALLS_OF_4), tmp_path / "results"
    with pytest.raises(RunStopped) as stopped:
        submit(str(spec), results, progress=_InterruptedAt(3))
    run_id = stopped.value.run_id
    info = load_run(results, run_id)
    assert (stopped.value.state, info.state) == ("interrupted", "interrupted")
    assert info.pools, "the pools the run placed are kept: its resume measures the same pools' items"
    assert 3 <= raw_row_count(results, run_id) < len(planned_ids(spec))

    submit(None, results, resume=run_id)
    assert_one_row_per_item(results, run_id, planned_ids(spec))
    assert load_run(results, run_id).state == "finished"


def test_a_stop_while_a_finished_run_lets_its_workers_go_leaves_it_finished(
    ray_two_gpus: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tunectl.orchestrator import lifecycle as orchestration

    stop_pools = orchestration.stop_pools

    def stopped_while_releasing(pools: list[object]) -> None:
        stop_pools(pools)  # type: ignore[arg-type]
        raise KeyboardInterrupt  # a Ctrl-C that lands as the workers are let go

    monkeypatch.setattr(orchestration, "stop_pools", stopped_while_releasing)
    spec, results = write_spec(tmp_path, '[[configs]]\nfault = "none"\n'), tmp_path / "results"
    with pytest.raises(KeyboardInterrupt) as stopped:
        submit(str(spec), results)
    assert isinstance(stopped.value, RunStopped) and stopped.value.state == "finished"
    assert load_run(results, stopped.value.run_id).state == "finished"
    assert_one_row_per_item(results, stopped.value.run_id, planned_ids(spec))
    assert "had finished, every item measured" in stopped_message(stopped.value, results)
