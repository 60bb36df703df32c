"""Resident workers on a real local Ray instance: started once, measured on by the runs that join
the cluster, given back when a run ends (its stop included), refused to runs started otherwise or
while another live run holds them, taken over from a driver that died holding them, stopped."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import local_cluster
from tests.integration.test_faults import assert_one_row_per_item, by_fault, planned_ids, write_spec
from tunectl import api
from tunectl.core.errors import UserError
from tunectl.orchestrator import resident
from tunectl.orchestrator.submit import RunOptions, submit
from tunectl.store.results import read_results
from tunectl.store.runs import load_run

pytestmark = pytest.mark.slow

FAST = '[[configs]]\nfault = "none"\nrun_ms = 1\nvariant = [1, 2, 3, 4]\n'


@pytest.fixture
def cluster(ray_two_gpus: None) -> Iterator[api.Cluster]:
    """The shared instance as a cluster to join; whatever resident workers a test left are stopped."""
    import ray

    try:
        yield api.Cluster(address=ray.get_runtime_context().gcs_address)
    finally:
        resident.down(force=True)


def pids(statuses: api.workers.Statuses) -> list[int]:
    return sorted(s["pid"] for workers in statuses.values() for s in workers)


def test_runs_measure_on_the_resident_workers_and_give_them_back(
    cluster: api.Cluster, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, FAST, n=(4, 8))
    started = api.workers_up(api.load_spec(spec), cluster)
    assert list(started) == ["GPU"] and len(started["GPU"]) == 2, "one resident worker per GPU"

    for runs in (1, 2):
        out = submit(str(spec), tmp_path / "results", options=RunOptions(compile_ahead=False))
        rows = assert_one_row_per_item(tmp_path / "results", out.run_id, planned_ids(spec))
        assert out.placement is not None and out.placement.num_resident == out.placement.num_workers == 2
        assert {int(r.worker.rsplit(":", 1)[1]) for r in rows} <= set(pids(started)), "a worker of its own"
        now = api.workers_list(cluster)["GPU"]
        assert [s["resident"]["runs"] for s in now] == [runs, runs] and not any(s["run"] for s in now)

    assert pids(api.workers_list(cluster)) == pids(started), "the same processes, kept between runs"
    with pytest.raises(UserError, match="up already"):
        api.workers_up(api.load_spec(spec), cluster)
    assert api.workers_down(cluster) == 2 and api.workers_list(cluster) == {}
    out = submit(str(spec), tmp_path / "after", options=RunOptions(compile_ahead=False))  # GPUs given back
    assert load_run(tmp_path / "after", out.run_id).state == "finished"
    assert out.placement is not None and out.placement.num_resident == 0


def test_a_run_started_otherwise_is_refused_and_holds_nothing(cluster: api.Cluster, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, FAST)
    api.workers_up(api.load_spec(spec), cluster, api.CompileOptions(cache=str(tmp_path / "theirs")))
    options = RunOptions(
        compile_ahead=False, compile_options=api.CompileOptions(cache=str(tmp_path / "mine"))
    )

    with pytest.raises(UserError, match=r"started otherwise .*theirs.*this run: .*mine"):
        submit(str(spec), tmp_path / "results", options=options)
    assert not any(s["run"] for s in api.workers_list(cluster)["GPU"])


def test_a_live_run_keeps_them_and_a_dead_drivers_run_is_taken_over(
    cluster: api.Cluster, tmp_path: Path
) -> None:
    from tunectl.orchestrator.cluster import WorkerSetup

    spec = write_spec(tmp_path, FAST)
    api.workers_up(api.load_spec(spec), cluster)
    setup = WorkerSetup()
    taken = resident.take(["GPU"], None, setup, "run-a")
    assert [p.name for p in taken] == ["GPU"]
    with pytest.raises(UserError, match="measuring run run-a of another driver"):
        resident.take(["GPU"], None, setup, "run-b")
    with pytest.raises(UserError, match="run-a"):
        api.workers_down(cluster)
    resident.release(taken)

    # A driver that takes them and dies without a word: its job ends, so the next run takes over.
    script = (
        "import os, ray\n"
        f"ray.init(address={cluster.address!r}, logging_level='ERROR')\n"
        "from tunectl.orchestrator import resident\n"
        "from tunectl.orchestrator.cluster import WorkerSetup\n"
        "assert resident.take(['GPU'], None, WorkerSetup(), 'run-dead')\n"
        "ray.shutdown()\n"
        "os._exit(0)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)
    assert {s["run"] for s in api.workers_list(cluster)["GPU"]} == {"run-dead"}
    taken = resident.take(["GPU"], None, setup, f"run-{secrets.token_hex(2)}")
    assert [p.name for p in taken] == ["GPU"]
    resident.release(taken)


def test_a_run_starts_no_compile_process_for_kernels_its_resident_workers_built(
    cluster: api.Cluster, tmp_path: Path
) -> None:
    """Resident workers tell each run which of its kernels their node's cache settles: built by them
    in an earlier run, or rejected by the compiler and remembered. Where that is every kernel the run
    needs, it starts no compile process (nor waits for one)."""
    import json

    from tests.integration.test_builds_on_ray import builds_logged

    configs = '[[configs]]\nfault = "none"\ncompile_ms = 200\nvariant = [0, 1, 2]\n'
    spec = write_spec(tmp_path, configs + '[[configs]]\ncompile_ms = 50\ncompile_fault = "reject"\n')
    cache = tmp_path / "cache"
    api.workers_up(api.load_spec(spec), cluster, api.CompileOptions(cache=str(cache)))
    options = RunOptions(compile_ahead=False, compile_options=api.CompileOptions(2, str(cache)))
    processes, statuses = [], []
    for name in ("first", "second"):
        out = submit(str(spec), tmp_path / name, options=options)
        rows = assert_one_row_per_item(tmp_path / name, out.run_id, planned_ids(spec))
        statuses.append({r.status for r in rows})
        meta = json.loads((tmp_path / name / "_runs" / f"{out.run_id}.json").read_text())["compile"]
        processes.append(meta["compile_processes"])
    assert processes == [2, 0], "the second run's kernels were all settled by the first"
    assert statuses == [{"ok", "compile_error"}, {"ok", "error"}], "rejected, then remembered"
    assert sorted(builds_logged(cache).values()) == [1, 1, 1], "each kernel compiled once, in the first run"


def test_a_resident_worker_that_dies_in_a_run_comes_back_resident(
    cluster: api.Cluster, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, '[[configs]]\nfault = "exit"\n' + FAST)
    before = pids(api.workers_up(api.load_spec(spec), cluster))

    out = submit(str(spec), tmp_path / "results", options=RunOptions(compile_ahead=False))
    rows = assert_one_row_per_item(tmp_path / "results", out.run_id, planned_ids(spec))
    assert by_fault(rows) == {"exit": {"crash"}, "none": {"ok"}}
    after = api.workers_list(cluster)["GPU"]
    assert len(after) == 2 and not any(s["run"] for s in after), "given back, the restarted one too"
    assert pids({"GPU": after}) != before, "the process it killed was started again, under its name"


def test_a_pool_without_resident_workers_gets_its_own_beside_them(tmp_path: Path) -> None:
    """On a cluster of two GPU kinds with resident workers on one, a run for both measures on those
    and starts its own on the other; one for the other kind alone starts its own, and leaves them."""
    import ray

    a100 = {"num_cpus": 1, "num_gpus": 1, "resources": {"accelerator_type:A100": 1}}
    h100 = {"num_cpus": 1, "num_gpus": 1, "resources": {"accelerator_type:H100": 1}}
    with local_cluster(a100, h100):
        here = api.Cluster(address=ray.get_runtime_context().gcs_address)
        only_a100 = write_spec(tmp_path, FAST, resources='accelerator_type = "A100"')
        api.workers_up(api.load_spec(only_a100), here)
        try:
            both = write_spec(tmp_path, FAST)
            out = submit(str(both), tmp_path / "both", options=RunOptions(compile_ahead=False))
            assert out.placement is not None and out.placement.pools == ("A100", "H100")
            assert (out.placement.num_workers, out.placement.num_resident) == (2, 1)
            rows = read_results(tmp_path / "both", run_ids=[out.run_id])
            assert len(rows) == 2 * len(planned_ids(both)) and {r.status for r in rows} == {"ok"}
            h100_only = write_spec(tmp_path, FAST, resources='accelerator_type = "H100"')
            out = submit(str(h100_only), tmp_path / "h100", options=RunOptions(compile_ahead=False))
            assert out.placement is not None and out.placement.num_resident == 0
            assert [s["run"] for s in api.workers_list(here)["A100"]] == [None], "left as they were"
        finally:
            resident.down(force=True)
