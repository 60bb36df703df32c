"""What `submit --job`, `logs` and `cancel` say when asked wrongly: one line, exit code 2, nothing sent."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tunectl.cli import app
from tunectl.orchestrator.jobs import dashboard_address
from tunectl.store.runs import RunInfo, save_run


def run(*args: str) -> tuple[int, str]:
    out = CliRunner().invoke(app, list(args))
    return out.exit_code, out.output


@pytest.mark.parametrize(
    ("address", "expected"),
    [("head:8265", "http://head:8265"), ("http://head:8265", "http://head:8265"), ("https://h", "https://h")],
)
def test_a_dashboard_address_may_leave_out_its_scheme(address: str, expected: str) -> None:
    assert dashboard_address(address) == expected


def test_a_job_needs_a_dashboard_address_not_a_client_one(tiny_spec: Path) -> None:
    code, out = run("submit", str(tiny_spec), "--job", "--address", "ray://head:10001", "--results", "/r")
    assert code == 2 and "jobs go to the dashboard" in out and "Traceback" not in out
    code, out = run("submit", str(tiny_spec), "--job", "--results", "/r")
    assert code == 2 and "--address http://HEAD:8265" in out


def test_a_job_needs_results_on_an_absolute_path_of_the_cluster(tiny_spec: Path) -> None:
    code, out = run("submit", str(tiny_spec), "--job", "--address", "http://head:8265", "--results", "rel")
    assert code == 2 and "absolute path" in out


def test_a_job_with_a_bad_spec_fails_here_before_anything_is_sent(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('task = "fault_injection"\n[shapes.n]\nvalues = [0]\n[configs]\nfault = "none"\n')
    code, out = run("submit", str(bad), "--job", "--address", "http://127.0.0.1:9", "--results", "/r")
    assert code == 2 and "shapes.n.values" in out


def test_logs_and_cancel_of_an_unknown_run_say_how_to_list_runs(tmp_path: Path) -> None:
    for command in ("logs", "cancel"):
        code, out = run(command, "r-nope", "--results", str(tmp_path))
        assert code == 2 and "tunectl runs" in out


def test_cancel_refuses_a_run_that_is_not_running(tmp_path: Path) -> None:
    save_run(tmp_path, RunInfo("r1", "n", "fault_injection", "s.toml", "", "finished", 1, 0.0, 0.0))
    code, out = run("cancel", "r1", "--results", str(tmp_path))
    assert code == 2 and "not running (it is finished)" in out


def test_a_running_run_whose_driver_is_gone_is_marked_interrupted_by_cancel(tmp_path: Path) -> None:
    info = RunInfo("r2", "n", "fault_injection", "s.toml", "", "running", 1, 0.0, 0.0).with_driver()
    save_run(tmp_path, dataclasses.replace(info, driver_pid=2**22 + 12345))  # no such process
    code, out = run("cancel", "r2", "--results", str(tmp_path))
    assert code == 0 and "marked interrupted" in out
    code, out = run("logs", "r2", "--results", str(tmp_path))
    assert code == 0 and "r2: interrupted" in out
