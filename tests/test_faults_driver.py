"""The driver itself stops mid-run (SIGKILL, or `tunectl cancel`): `submit --resume` finishes the run."""

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

from tests.test_faults import assert_one_row_per_item, planned_ids, write_spec
from tunectl.cli import app
from tunectl.store.runs import list_runs, summarise_runs

pytestmark = pytest.mark.slow

SLOW = '[[configs]]\nfault = "none"\nrun_ms = 60\nvariant = [' + ", ".join(map(str, range(30))) + "]\n"


@contextlib.contextmanager
def driver(*args: str) -> Iterator[subprocess.Popen[str]]:
    """`tunectl ARGS` in a session of its own; whatever it started is killed when the test is done."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunectl", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )  # fmt: skip
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the Ray processes this driver started
        proc.wait()


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
    spec, results = write_spec(tmp_path, SLOW), tmp_path / "results"
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


def test_cancel_stops_a_local_run_cleanly_and_resume_finishes_it(tmp_path: Path) -> None:
    spec, results = write_spec(tmp_path, SLOW), tmp_path / "results"
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


def test_a_cancel_is_recorded_cancelled_even_when_it_arrives_as_a_plain_interrupt() -> None:
    from tunectl.orchestrator import submit as orchestration

    orchestration._cancel_requested.clear()
    assert orchestration._stopped_state(KeyboardInterrupt()) == "interrupted"
    with pytest.raises(orchestration.RunCancelled):
        orchestration.request_cancel()
    try:  # a library (Ray inside ray.wait) may re-raise the cancel as a plain KeyboardInterrupt
        assert orchestration._stopped_state(KeyboardInterrupt()) == "cancelled"
    finally:
        orchestration._cancel_requested.clear()
