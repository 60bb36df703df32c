"""Faults inside one worker, driven by the fault-injection task on 2 logical GPUs.

Whatever a config does (raise, return garbage, kill its process, hang), the run finishes and the
dataset holds exactly one row per planned item. The helpers here are shared by the other fault tests.
"""

from __future__ import annotations

import glob
import re
import secrets
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from tunectl.core.plan import plan
from tunectl.core.record import Record
from tunectl.core.spec import load_spec
from tunectl.orchestrator.submit import RunOptions, submit
from tunectl.store.results import read_results
from tunectl.store.runs import load_run, run_log_path

pytestmark = pytest.mark.slow

MEASURE = """
[search]
finalists = 0  # one record per planned item: what these tests count
[measure]
warmup = 0
min_samples = 1
max_samples = 2
max_seconds = 0.05
deadline_seconds = {deadline}
"""


def write_spec(
    directory: Path, configs: str, n: tuple[int, ...] = (4,), deadline: float = 30.0, **extra: str
) -> Path:
    """A fault-injection spec: ``configs`` is TOML for its ``[[configs]]`` tables."""
    text = f'name = "faults"\ntask = "fault_injection"\n[shapes.n]\nvalues = {list(n)}\n'
    text += textwrap.dedent(configs) + MEASURE.format(deadline=deadline)
    for table, body in extra.items():
        text += f"[{table}]\n{textwrap.dedent(body)}\n"
    path = directory / f"spec-{secrets.token_hex(3)}.toml"
    path.write_text(text)
    return path


def planned_ids(spec: Path) -> list[str]:
    return sorted(i.item_id for i in plan(load_spec(spec)).work_items())


def raw_row_count(results: Path, run_id: str) -> int:
    """Rows in the run's Parquet parts, counted without the reader's dedupe."""
    import pyarrow.parquet as pq

    parts = glob.glob(str(results / "task=*" / f"run_id={run_id}" / "*.parquet"))
    return sum(pq.read_metadata(p).num_rows for p in parts if not Path(p).name.startswith((".", "_")))


def assert_one_row_per_item(results: Path, run_id: str, expected_ids: list[str]) -> list[Record]:
    rows = read_results(results, run_ids=[run_id])
    assert sorted(r.item_id for r in rows) == sorted(expected_ids), "an item is missing or extra"
    assert raw_row_count(results, run_id) == len(expected_ids), "an item was written twice"
    return rows


def by_fault(rows: list[Record]) -> dict[str, set[str]]:
    """fault name -> the statuses its rows ended with."""
    out: dict[str, set[str]] = {}
    for row in rows:
        fault = re.search(r'"fault":"(\w+)"', row.config_key)
        out.setdefault(fault.group(1) if fault else "?", set()).add(row.status)
    return out


def worker_pids(rows: list[Record]) -> set[str]:
    return {r.worker for r in rows if r.worker}


def test_configs_that_raise_or_return_wrong_results_are_recorded_and_the_run_goes_on(
    ray_two_gpus: None, tmp_path: Path
) -> None:
    spec = write_spec(
        tmp_path, '[[configs]]\nfault = ["raise", "invalid", "wrong", "nan", "none"]\nrun_ms = 1\n', n=(4, 8)
    )
    out = submit(str(spec), tmp_path / "results")

    rows = assert_one_row_per_item(tmp_path / "results", out.run_id, planned_ids(spec))
    assert by_fault(rows) == {
        "raise": {"error"},
        "invalid": {"invalid"},
        "wrong": {"wrong_result"},
        "nan": {"wrong_result"},
        "none": {"ok"},
    }
    raised = next(r for r in rows if r.status == "error")
    assert "injected failure" in raised.message
    assert len(worker_pids(rows)) <= 2, "nobody died: the first worker processes did everything"
    assert " failed " not in run_log_path(tmp_path / "results", out.run_id).read_text()
    assert load_run(tmp_path / "results", out.run_id).state == "finished"


def test_a_config_that_kills_its_worker_is_retried_once_then_recorded_as_crash(
    ray_two_gpus: None, tmp_path: Path
) -> None:
    token = secrets.token_hex(4)
    spec = write_spec(
        tmp_path,
        f'[[configs]]\nfault = ["exit", "exit_once"]\ntoken = "{token}"\n'
        '[[configs]]\nfault = "none"\nrun_ms = 20\nvariant = [1, 2, 3, 4, 5, 6]\n',
    )
    out = submit(str(spec), tmp_path / "results", options=RunOptions(compile_ahead=False))

    rows = assert_one_row_per_item(tmp_path / "results", out.run_id, planned_ids(spec))
    assert by_fault(rows) == {"exit": {"crash"}, "exit_once": {"ok"}, "none": {"ok"}}
    crash = next(r for r in rows if r.status == "crash")
    assert "died while running it 2 times" in crash.message
    events = run_log_path(tmp_path / "results", out.run_id).read_text()
    assert len(set(re.findall(r"ready: pid (\d+)", events))) == 2 + 3, "each death brought a fresh process"
    assert events.count("runs again, alone") == 2 and events.count("recorded as crash") == 1


def test_a_crash_while_compiling_ahead_is_blamed_on_the_config_that_caused_it(
    ray_two_gpus: None, tmp_path: Path
) -> None:
    spec = write_spec(
        tmp_path,
        '[[configs]]\nfault = "exit"\nwhere = "prepare"\n'
        '[[configs]]\nfault = "none"\nrun_ms = 30\nvariant = [1, 2, 3, 4, 5, 6, 7, 8]\n',
    )
    out = submit(str(spec), tmp_path / "results", options=RunOptions(compile_ahead=True))

    rows = assert_one_row_per_item(tmp_path / "results", out.run_id, planned_ids(spec))
    assert by_fault(rows) == {"exit": {"crash"}, "none": {"ok"}}, "only the config that exits is a crash"


def test_a_hanging_config_times_out_and_its_worker_is_replaced(ray_two_gpus: None, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        '[[configs]]\nfault = "hang"\nwhere = ["call", "prepare"]\n'
        '[[configs]]\nfault = "none"\nrun_ms = 10\nvariant = [1, 2, 3, 4]\n',
        deadline=1.5,
    )
    out = submit(str(spec), tmp_path / "results", options=RunOptions(compile_ahead=True))

    rows = assert_one_row_per_item(tmp_path / "results", out.run_id, planned_ids(spec))
    assert by_fault(rows) == {"hang": {"timeout"}, "none": {"ok"}}
    assert all("deadline of 1.5 s" in r.message for r in rows if r.status == "timeout")
    assert Counter(r.status for r in rows)["timeout"] == 2
    events = run_log_path(tmp_path / "results", out.run_id).read_text()
    deadlines = [
        float(s) for s in re.findall(r"ran past its ([\d.]+) s deadline; killing the worker", events)
    ]
    # Each hanging config is killed once alone; a batch it hung in (deadline: its members' together)
    # is killed once before its members run again alone.
    assert deadlines.count(1.5) == 2
    assert all(d > 1.5 for d in deadlines if d != 1.5) and len(deadlines) <= 4


def test_an_arm_that_kills_its_worker_is_recorded_crash_and_the_comparison_goes_on(
    ray_two_gpus: None, tmp_path: Path
) -> None:
    from tunectl.core.keys import make_key
    from tunectl.core.plan import comparison
    from tunectl.core.record import Phase
    from tunectl.decide.work import FixedItems
    from tunectl.orchestrator.submit import new_run, run

    spec = load_spec(write_spec(tmp_path, '[[configs]]\nfault = "none"\n'))
    arms = tuple(
        make_key(c)
        for c in (
            {"fault": "none"},
            {"fault": "exit"},
            {"fault": "none", "variant": 1},
            {"fault": "exit", "variant": 2},
        )
    )
    item = comparison("fault_injection", make_key({}), make_key({"n": 4}), arms, Phase.HOLDOUT, rounds=2)
    results = tmp_path / "results"
    info = new_run(spec, results=results, num_planned=len(arms), kind="holdout")
    out = run(
        lambda pool: FixedItems([item], pool), spec.resources, spec.measure, results=results, info=info,
        options=RunOptions(compile_ahead=False, num_gpus=1),
    )  # fmt: skip

    rows = assert_one_row_per_item(results, out.run_id, list(item.record_ids()))
    statuses = {r.config_key: r.status for r in rows}
    assert statuses == {
        '{"fault":"none"}': "ok",
        '{"fault":"exit"}': "crash",
        '{"fault":"none","variant":1}': "ok",
        '{"fault":"exit","variant":2}': "crash",
    }
    assert all("comparison went on without it" in r.message for r in rows if r.status == "crash")
    events = run_log_path(results, out.run_id).read_text()
    assert events.count("in the comparison at") == 2 and "runs again, alone" not in events
    assert "finished: 4 record(s), 2 worker failure(s)" in events, "one death per crashed arm, no more"
