"""Resident workers' own rules, without Ray: who holds a worker, what a run must find it started
with, and how a run's lines say that its workers were resident."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import TINY_SPEC
from tunectl.cli import app
from tunectl.orchestrator.cluster import CPU_POOL, WorkerSetup
from tunectl.orchestrator.resident import Lease, differences, for_worker, wants
from tunectl.orchestrator.slots import startup_text
from tunectl.report.worker_time import WorkerTime

STARTUP = {
    "process_s": 3.0,
    "imports_s": 0.1,
    "device_s": 4.0,
    "libraries": {"flashinfer": 2.5},
    "total_s": 25.5,
}


def test_a_lease_is_held_by_one_run_at_a_time_and_counts_the_runs() -> None:
    lease = Lease()
    assert lease.take("a", "job1") is None and lease.take("a", "job1") is None
    assert lease.take("b", "job2") == {"run": "a", "job": "job1"}, "another run is refused, told who holds it"
    assert lease.take("b", "job2", take_from="job9") == {"run": "a", "job": "job1"}, "only its dead job's"
    assert lease.take("b", "job2", take_from="job1") is None, "taken over from a driver that is gone"
    lease.give_back("a")  # the run it was taken from gives back nothing
    assert lease.run_id == "b" and lease.runs == 2
    lease.give_back("b")
    assert lease.run_id is None and lease.summary()["resident"]["runs"] == 2


def test_a_process_restarted_mid_run_is_held_by_the_run_that_calls_it() -> None:
    lease = Lease()  # a new process: it has forgotten its holder and its runs
    lease.hold("a")
    assert lease.take("b", "job2") == {"run": "a", "job": ""}
    assert lease.summary() == {}, "no runs served: its start-up was this run's"


def test_a_worker_started_otherwise_is_told_apart_by_name() -> None:
    setup = WorkerSetup(env=(("TORCHINDUCTOR_CACHE_DIR", "/c/mine"),), forwarded=("PYTORCH_CUDA_ALLOC_CONF",))
    asked = wants(setup, "H200")
    same = {
        "compile_ahead": False,
        "env": {"TORCHINDUCTOR_CACHE_DIR": "/c/mine", "PYTORCH_CUDA_ALLOC_CONF": None},
    }
    assert differences(asked, same) is None
    other = {
        **same,
        "env": {
            "TORCHINDUCTOR_CACHE_DIR": "/c/theirs",
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        },
    }
    said = differences(asked, other) or ""
    assert "TORCHINDUCTOR_CACHE_DIR='/c/theirs' (this run: '/c/mine')" in said
    assert "PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True' (this run: None)" in said, "a setting it lacks"
    assert "compile_ahead True (this run: False)" in (
        differences(asked, {**same, "compile_ahead": True}) or ""
    )


def test_a_cpu_worker_is_compared_by_the_threads_it_would_have_on_its_cores() -> None:
    asked = wants(WorkerSetup(), CPU_POOL)
    assert for_worker(asked, cpus=8)["threads"] == 7, "the default: all cores but one"
    assert differences(for_worker(asked, 8), {"compile_ahead": False, "env": {}, "threads": 7}) is None
    assert differences(for_worker(wants(WorkerSetup(cpu_threads=2), CPU_POOL), 8), {"threads": 7, "env": {}})


def test_the_lines_say_a_resident_workers_start_up_came_before_the_run() -> None:
    resident = {**STARTUP, "resident": {"runs": 3, "up_s": 120.0}}
    assert startup_text(resident).startswith("; resident, up 120 s, run 3 on it; start-up 25.5 s")
    assert startup_text(STARTUP).startswith("; start-up 25.5 s")
    times = WorkerTime("vm:1", 40.0, 8.0, 18.0, 1.5, 6.0, 1.0, 0.3)
    assert times.line(resident).startswith("vm:1: resident (started in 25.5 s before its first run), 40.0 s")
    assert times.line(STARTUP).startswith("vm:1: started in 25.5 s (kernel libraries 2.5 s), then 40.0 s")


@pytest.mark.parametrize("command", [["up", "SPEC"], ["list"], ["down"]])
def test_workers_need_a_cluster_that_outlives_the_command(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = tmp_path / "tiny.toml"
    spec.write_text(TINY_SPEC)
    out = CliRunner().invoke(app, ["workers", *[str(spec) if c == "SPEC" else c for c in command]])
    assert out.exit_code == 2 and out.output.startswith("error: resident workers need a cluster")
    assert len(out.output.strip().splitlines()) == 1


def test_another_compile_cache_is_said_as_its_root() -> None:
    from tunectl.tasks.compile import cache_env

    asked = wants(WorkerSetup(env=tuple(cache_env("/c/mine").items())), "H200")
    has = {"compile_ahead": False, "env": cache_env("/c/theirs")}
    assert differences(asked, has) == "the compile cache '/c/theirs' (this run: '/c/mine')"
