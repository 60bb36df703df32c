"""What worker and compile processes say on the side (Python warnings, kernel libraries' logs) goes
to the run's log, not the console: counted by kind in the process, written to the log when the run
ends, and said on the console in one line per kind."""

from __future__ import annotations

import logging
import os
import pstats
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tunectl.cli import app
from tunectl.orchestrator.notes import Note, captured, keep_notes
from tunectl.store.runs import RunInfo, save_run
from tunectl.tasks.fault_injection import PRINTED, WARNING


def test_a_processs_warnings_and_library_logs_are_counted_not_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with captured() as notes:
            for _ in range(3):
                warnings.warn("a kernel library's warning", UserWarning, stacklevel=1)
            logging.getLogger("triton.runtime.autotuner").warning("autotuning took long")
            logging.getLogger("tunectl.flex").warning("no package for a kernel")
            drained = notes.drain("worker 1")
    assert capsys.readouterr().err == ""
    counted = {(n.kind, n.text.split(" (")[0], n.count) for n in drained}
    assert counted == {
        ("UserWarning", "a kernel library's warning", 3),
        ("triton.runtime.autotuner", "autotuning took long", 1),
        ("tunectl.flex", "no package for a kernel", 1),
    }
    assert {n.source for n in drained} == {"worker 1"}
    assert notes.drain() == [], "a drain starts the counts again"


def test_kept_notes_are_in_the_runs_log_and_the_console_has_one_line_counting_each_kind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    results = tmp_path / "results"
    save_run(results, RunInfo("r1", "n", "t", "s.toml", "", "finished", 1, 0.0, 0.0))
    notes = [
        Note("UserWarning", "first (a.py:1)", 3, "worker 1"),
        Note("UserWarning", "second (a.py:2)", 2, "worker 2"),
        Note("torch", "recompiling", 1, "compile process 1"),
    ]
    with caplog.at_level(logging.WARNING, logger="tunectl.run"):
        keep_notes(notes, results, "r1")
    where = f"`tunectl logs r1 --results {results}` shows them"
    assert [r.getMessage() for r in caplog.records] == [
        f"6 message(s) from worker and compile processes (5 UserWarning, 1 torch); {where}",
    ]
    logged = CliRunner().invoke(app, ["logs", "r1", "--results", str(results)]).output
    assert "worker 1: UserWarning x3: first (a.py:1)" in logged and "compile process 1: torch x1" in logged


@pytest.mark.slow
def test_a_workers_warning_and_printed_lines_reach_the_runs_log_and_not_the_console(tmp_path: Path) -> None:
    spec = tmp_path / "warns.toml"
    spec.write_text(
        'task = "fault_injection"\n[shapes.n]\nvalues = [8]\n[[configs]]\nfault = ["none", "warn", "print"]\n'
        "[measure]\nmin_samples = 3\nmax_seconds = 0.05\n[search]\nfinalists = 0\n"
    )
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "tunectl", "submit", str(spec), "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "TUNECTL_PROFILE": str(tmp_path / "profiles")},
    )
    console = " ".join((done.stdout + done.stderr).split())  # lines the console wrapped, whole again
    assert done.returncode == 0, console
    assert WARNING not in console
    # The worker also profiled its calls, as TUNECTL_PROFILE asked, and left the profile at the end.
    [profile] = (tmp_path / "profiles").glob("worker-*.pstats")
    functions = {func for _, _, func in pstats.Stats(str(profile)).stats}  # type: ignore[attr-defined]
    assert "_measure_each" in functions
    [run_id] = [p.stem for p in (results / "_runs").glob("*.json")]
    [counted] = re.findall(r"(\d+) message\(s\) from worker and compile processes \(([^)]*)\)", console)
    assert "1 UserWarning" in counted[1] and re.search(r"\b\d+ printed\b", counted[1]), counted
    assert f"`tunectl logs {run_id} --results" in console
    assert PRINTED not in console
    logged = CliRunner().invoke(app, ["logs", run_id, "--results", str(results)]).output
    assert f"UserWarning x1: {WARNING}" in logged
    assert f"printed x3: {PRINTED}" in logged
