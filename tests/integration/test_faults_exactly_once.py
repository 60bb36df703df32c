"""Exactly once through every stop: the driver is killed (SIGKILL), interrupted (SIGINT) or cancelled
at a loop of record counts, the finals included, and resumed each time; the raw dataset, read by
DuckDB without any dedupe, then holds exactly one row per planned item and per arm of each
comparison. Also: a run whose every measurement failed exits non-zero and says where to look."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from tests.conftest import TINY_SPEC
from tests.integration.test_faults import raw_row_count
from tests.integration.test_faults_driver import driver
from tunectl.cli import app
from tunectl.core.plan import plan
from tunectl.core.spec import load_spec
from tunectl.decide.search import Search
from tunectl.store.results import read_results
from tunectl.store.runs import list_runs, load_run

pytestmark = pytest.mark.slow

#: real CPU measurements: 6 points x 4 configs, then a comparison per point of 4 arms (a tie as
#: wide as the default's own time lets every config in, however noisy a busy machine makes them: the
#: finals last long enough for the stops meant to land in them); a point's finals start as soon as its
#: 4 items are in. Each measurement samples for its whole 0.1 s (no sample cap, a noise target no
#: kernel meets), so the run lasts long enough for every stop however busy the machine is.
SPEC = (
    TINY_SPEC.replace("max_seconds = 0.05", "max_seconds = 0.1\nnoise_target = 0.000001")
    .replace("max_samples = 20", "max_samples = 1000000")
    .replace("min_samples = 3", "min_samples = 10")
    .replace("rounds = 3", "rounds = 3\ntie = 1.0")
)
STOPS = (
    (3, "kill"),
    (7, "interrupt"),
    (12, "kill"),
    (17, "cancel"),
    (22, "kill"),
    (27, "kill"),
    (32, "kill"),
)


def _stop(proc: subprocess.Popen[str], how: str, results: Path) -> None:
    if how == "kill":
        proc.send_signal(signal.SIGKILL)
    elif how == "interrupt":
        proc.send_signal(signal.SIGINT)
    else:
        (run,) = [r for r in list_runs(results) if r.driver_pid == proc.pid]
        cancel = subprocess.run(
            [sys.executable, "-m", "tunectl", "cancel", run.run_id, "--results", str(results)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        # A cancel that comes as the run finishes finds nothing running: too late, not wrong.
        assert cancel.returncode == 0 or load_run(results, run.run_id).state == "finished", cancel.stderr
    proc.wait(timeout=60)


def _run_until(args: list[str], results: Path, rows: int, how: str) -> str | None:
    """Run ``tunectl ARGS`` until the run has ``rows`` raw rows, then stop it. Returns where it was
    stopped ("measure" or "finals"), or None if it finished first."""
    with driver(*args) as proc:
        while proc.poll() is None:
            runs = list_runs(results) if (results / "_runs").is_dir() else []
            # Stop only a run this driver has taken over: a resume's earlier rows already count, and
            # until it marks the run as its own, the run file still describes the stopped driver.
            driven = [r for r in runs if r.driver_pid == proc.pid and r.state == "running"]
            if driven and raw_row_count(results, driven[0].run_id) >= rows:
                glob = str(results / "task=*" / f"run_id={driven[0].run_id}" / "*.parquet")
                [(finals,)] = duckdb.sql(
                    f"select count(*) from read_parquet('{glob}') where phase = 'final'"
                ).fetchall()
                _stop(proc, how, results)
                return "finals" if finals else "measure"
            time.sleep(0.05)
        out = proc.stdout.read() if proc.stdout else ""
        assert proc.returncode == 0, f"the driver failed on its own (exit {proc.returncode}):\n{out[-3000:]}"
    return None


def test_stops_at_any_record_count_then_resume_leave_exactly_one_row_per_item(tmp_path: Path) -> None:
    spec, results = tmp_path / "once.toml", tmp_path / "results"
    spec.write_text(SPEC)
    stopped = []
    for rows, how in STOPS:
        runs = list_runs(results) if (results / "_runs").is_dir() else []
        unfinished = [r for r in runs if r.state != "finished"]
        # A stop that came as the run finished leaves it finished: the next stop takes a new run.
        args = ["submit", "--resume", unfinished[0].run_id] if unfinished else ["submit", str(spec)]
        where = _run_until([*args, "--results", str(results)], results, rows, how)
        if where is not None:
            stopped.append(where)
    assert len(stopped) >= 4, "the runs finished before most stops: make their items slower"
    assert "finals" in stopped, "no stop came inside the finals"
    for run in list_runs(results):
        if run.state != "finished":
            with driver("submit", "--resume", run.run_id, "--results", str(results)) as proc:
                out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, out
        _assert_exactly_once(results, run.run_id, spec)


def _assert_exactly_once(results: Path, run_id: str, spec: Path) -> None:
    """The run's raw rows, read by DuckDB without dedupe: one per planned item and per arm."""
    glob = str(results / "task=*" / f"run_id={run_id}" / "*.parquet")
    [(num_rows, num_items)] = duckdb.sql(
        f"select count(*), count(distinct item_id) from read_parquet('{glob}', hive_partitioning=true)"
    ).fetchall()
    assert num_rows == num_items, "an item or an arm was written twice"
    arms = duckdb.sql(
        f"select group_id, count(*) from read_parquet('{glob}') where phase = 'final' group by group_id"
    ).fetchall()
    assert arms and all(2 <= n <= 4 for _, n in arms), "comparisons of the default and 1-3 finalists"
    work = plan(load_spec(spec))
    ids = {r[0] for r in duckdb.sql(f"select item_id from read_parquet('{glob}')").fetchall()}
    assert {i.item_id for i in work.work_items()} <= ids, "a planned item has no row"
    search = Search(work)
    search.start(read_results(results, run_ids=[run_id]))
    assert search.draw(work.num_items) == [], "a comparison, or an arm of one, is missing"
    assert num_rows == work.num_items + sum(n for _, n in arms)


#: flash-attn backends only (fa4, the default, and fa2, fa3), on a machine without CUDA: all invalid
CUDA_ONLY = """name = "cuda_only"
task = "flash_decode"
[static]
causal = true
dtype = "float16"
head_dim = 64
num_kv_heads = 1
num_q_heads = 2
page_size = 16
sinks = false
softcap = 0.0
window = -1
[shapes.batch]
values = [1]
[shapes.kv_len]
values = [64]
[shapes.q_len]
values = [1]
[configs]
backend = ["fa2", "fa3"]
[search]
finalists = 0
"""


def test_a_run_where_every_measurement_failed_exits_1_and_points_to_the_failures(tmp_path: Path) -> None:
    spec, results = tmp_path / "fails.toml", tmp_path / "results"
    spec.write_text(CUDA_ONLY)
    with driver("submit", str(spec), "--results", str(results)) as proc:
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    (run,) = list_runs(results)
    assert f"error: run {run.run_id} produced no usable result (3 invalid)" in out
    assert f"tunectl failures --run {run.run_id} --results {results}" in out and "Traceback" not in out

    listed = CliRunner().invoke(app, ["failures", "--results", str(results), "--json"])
    assert listed.exit_code == 0, listed.output
    failed = json.loads(listed.output)
    assert len(failed) == 3 and {f["status"] for f in failed} == {"invalid"}
    assert all("runs on CUDA devices only" in f["message"] for f in failed)
