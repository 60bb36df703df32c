"""Interleaved comparisons in the worker, and stacked validation of bundles end to end.

Times come from the fault-injection task, whose configs sleep for what they say (``run_ms``): a
config that sleeps 1 ms per call is slower than the default's no-op beyond any noise.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tunectl.cli import app
from tunectl.core.keys import key_text, make_key
from tunectl.core.plan import comparison
from tunectl.core.record import Record
from tunectl.core.spec import MeasureSpec, parse_spec
from tunectl.decide.validate import plan_validation, read_validation
from tunectl.measure.runner import ItemRunner
from tunectl.store.bundle import TaskTable, build_files, publish_local
from tunectl.store.results import ResultsWriter, read_results
from tunectl.store.runs import RunInfo, save_run

FAST = MeasureSpec(warmup=0, min_samples=3, max_samples=6, max_seconds=0.05)
DEFAULT = make_key({"fault": "none"})
SLOW = make_key({"fault": "none", "run_ms": 1})
SHAPE = make_key({"n": 4})


def _compare(arms: tuple[Any, ...], phase: str = "final", layers: int = 0, rounds: int = 3) -> list[Record]:
    item = comparison("fault_injection", (), SHAPE, arms, phase, rounds=rounds, layers=layers)
    records = ItemRunner("cpu").run("r", item, FAST)
    assert isinstance(records, list)
    assert [r.item_id for r in records] == list(item.record_ids())
    assert {r.group_id for r in records} == {item.item_id} and all(r.rounds == rounds for r in records)
    return records


def test_finals_time_every_arm_in_rounds_and_pair_it_with_the_default() -> None:
    default, slow, wrong = _compare((DEFAULT, SLOW, make_key({"fault": "wrong"})))
    assert default.is_default and not slow.is_default and default.status == slow.status == "ok"
    assert default.speedup == 1.0 and default.speedup_lo == default.speedup_hi == 1.0
    assert slow.median_us is not None and slow.median_us >= 900  # a 1 ms sleep per call
    assert slow.speedup_hi is not None and slow.speedup_hi < 0.1, "1000x slower, beyond any noise"
    assert slow.speedup_lo is not None and slow.speedup_lo <= slow.speedup <= slow.speedup_hi
    assert slow.num_samples is not None and slow.num_samples >= 3 * 3
    assert wrong.status == "wrong_result" and wrong.speedup is None, "a wrong config is never timed"


def test_without_a_working_default_nothing_is_compared() -> None:
    broken, other = _compare((make_key({"fault": "wrong"}), SLOW))
    assert broken.status == "wrong_result"
    assert other.status == "error" and "default failed" in other.message


def test_a_stack_times_each_call_per_layer() -> None:
    # six rounds: one round slowed by a busy machine (a 2-core CI box) must not widen the interval past
    # what the assertions allow
    default, slow = _compare((DEFAULT, SLOW), phase="validate", layers=3, rounds=6)
    assert default.layers == slow.layers == 3 and slow.phase == "validate"
    assert slow.median_us is not None and 900 <= slow.median_us < 5000, "per layer: one 1 ms call"
    assert slow.speedup is not None and slow.speedup < 0.1, "a 1 ms call against a no-op"
    assert slow.speedup_hi is not None and slow.speedup_hi < 0.5


class _Bundle:
    def __init__(self, by_n: dict[int, dict[str, Any] | None]) -> None:
        self.by_n = by_n

    def lookup(self, task: str, **params: Any) -> dict[str, Any] | None:
        return self.by_n.get(params["n"])


SPEC = 'name = "v"\ntask = "fault_injection"\n[shapes.n]\nvalues = [1, 2, 4]\n[configs]\nrun_ms = [1]\n'


def test_validation_plans_a_comparison_where_the_bundle_left_the_default() -> None:
    spec = parse_spec(SPEC)
    bundle = _Bundle({1: None, 2: {"fault": "none"}, 4: {"fault": "none", "run_ms": 1}})
    items, skipped = plan_validation(spec, bundle, layers=5, rounds=4)
    [item] = items
    assert item.arms == (DEFAULT, SLOW) and item.layers == 5 and item.rounds == 4 and item.phase == "validate"
    assert dict(item.shape) == {"n": 4}
    assert sorted((dict(s.shape)["n"], s.why) for s in skipped) == [
        (1, "the bundle has no entry here"),
        (2, "the bundle keeps the default here"),
    ]


def _publish(store: Path, config: dict[str, Any]) -> Path:
    entry = {"static": {}, "shape": {"n": 4}, "config": config, "median_us": 1.0}
    table = TaskTable("fault_injection", (), {"n": {"policy": "exact", "points": [4]}}, (entry,))
    return publish_local(store, "fi", "1", build_files("fi", "1", [table], ["hand"], {}))


@pytest.mark.slow
def test_validate_reports_a_slower_bundle_and_exits_1(ray_two_gpus: None, tmp_path: Path) -> None:
    bundle = _publish(tmp_path / "bundles", {"fault": "none", "run_ms": 1})
    spec = tmp_path / "v.toml"
    spec.write_text(SPEC)
    results = tmp_path / "results"
    args = ["validate", str(bundle), "--spec", str(spec), "--layers", "2", "--rounds", "3"]
    out = CliRunner().invoke(app, [*args, "--results", str(results)])
    assert out.exit_code == 1, out.output
    assert "slower" in out.output and "geometric mean" in out.output and "Traceback" not in out.output
    rows = read_results(results)
    assert {r.phase for r in rows} == {"validate"} and len(rows) == 2
    validation = read_validation(rows)
    [point] = validation.points
    assert point.verdict == "slower" and validation.losers == [point] and validation.layers == 2


TWO_POINTS = """
name = "gqa"
task = "decode_attention"
[static]
dtype = "float32"
num_q_heads = 16
num_kv_heads = 2
head_dim = 64
page_size = 16
[shapes.batch]
values = [16]
[shapes.kv_len]
values = [1024]
[configs]
gqa = ["grouped"]
[measure]
warmup = 1
min_samples = 3
max_seconds = 0.3
[search]
rounds = 3
"""


@pytest.mark.slow
def test_export_validate_publishes_a_faster_bundle_and_refuses_a_slower_one(
    ray_two_gpus: None, tmp_path: Path
) -> None:
    runner = CliRunner()
    spec, results, store = tmp_path / "gqa.toml", tmp_path / "results", tmp_path / "bundles"
    spec.write_text(textwrap.dedent(TWO_POINTS))
    out = runner.invoke(app, ["submit", str(spec), "--results", str(results)])
    assert out.exit_code == 0, out.output
    export = [
        "export",
        "bundle",
        "--results",
        str(results),
        "--out",
        str(store),
        "--validate",
        "--layers",
        "2",
    ]
    out = runner.invoke(app, [*export, "--name", "good", "--version", "1", "--rounds", "3"])
    assert out.exit_code == 0, out.output
    assert (
        "validated and published good/1" in out.output and (store / "good" / "1" / "manifest.json").exists()
    )

    # Results that misjudged a slow config as the winner (as noise could): validation catches it.
    bad = tmp_path / "bad"
    fi_spec = SPEC.replace("[1, 2, 4]", "[4]")
    save_run(bad, RunInfo("rbad", "v", "fault_injection", "v.toml", fi_spec, "finished", 2, 1.0, 1.0))
    writer = ResultsWriter(bad)
    for config, default, speedup in ((DEFAULT, True, 1.0), (SLOW, False, 2.0)):
        writer.append(
            Record(
                run_id="rbad", item_id=key_text(config), task="fault_injection", static_key="{}",
                shape_key='{"n":4}', config_key=key_text(config),
                is_default=default, status="ok", median_us=10.0 / speedup, p20_us=10.0 / speedup,
                p80_us=10.0 / speedup, rel_noise=0.0, num_samples=10, phase="final", group_id="g", rounds=8,
                speedup=speedup, speedup_lo=speedup, speedup_hi=speedup, device_name="cpu", finished_at=2.0,
            )
        )  # fmt: skip
    writer.close()
    out = runner.invoke(
        app, ["export", "bundle", "--results", str(bad), "--out", str(store), "--validate", "--layers", "2",
              "--name", "bad", "--version", "1", "--rounds", "3"],
    )  # fmt: skip
    assert out.exit_code == 1, out.output
    assert "not published" in out.output and "slower than the defaults" in out.output
    assert not (store / "bad").exists(), "a refused bundle leaves nothing in the store"
    assert {r.phase for r in read_results(bad, run_ids=None) if r.run_id != "rbad"} == {"validate"}
