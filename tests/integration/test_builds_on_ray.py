"""Whole runs on 2 logical GPUs whose compile processes build each kernel once per node, and fail,
die and hang without taking down a GPU worker."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tunectl.core.keys import make_key
from tunectl.orchestrator.control import CompileOptions
from tunectl.orchestrator.submit import RunOptions

pytestmark = pytest.mark.slow


def builds_logged(cache: Path) -> Counter[str]:
    """Real compiles (not loads) of the stand-in compiler, per kernel."""
    log = cache / "tunectl" / "fault_injection" / "compiles.log"
    return Counter(log.read_text().split()) if log.exists() else Counter()


def test_each_kernel_is_compiled_once_per_node_and_workers_only_load_it(
    tmp_path: Path, ray_two_gpus: None
) -> None:
    from tests.integration.test_faults import assert_one_row_per_item, planned_ids, write_spec
    from tunectl.orchestrator.submit import submit

    configs = '[[configs]]\nfault = "none"\ncompile_ms = 400\nvariant = [0, 1, 2]\n'
    spec = write_spec(tmp_path, configs, n=(4, 8, 16, 32))  # 4 points x (3 + default) = 16 items
    cache = tmp_path / "cache"
    out = submit(
        str(spec), tmp_path / "results", options=RunOptions(compile_options=CompileOptions(2, str(cache)))
    )
    rows = assert_one_row_per_item(tmp_path / "results", out.run_id, planned_ids(spec))
    assert {r.status for r in rows} == {"ok"}
    assert set(builds_logged(cache).values()) == {1} and len(builds_logged(cache)) == 3, (
        "three distinct kernels (the key has no shape), each compiled once on the node"
    )
    loaded = [r for r in rows if json.loads(r.config_key).get("compile_ms") and r.compile_ms < 200]
    assert len(loaded) >= 9, "most items found their kernel built and only loaded it"
    meta = json.loads((tmp_path / "results" / "_runs" / f"{out.run_id}.json").read_text())["compile"]
    assert meta["cache"] == str(cache) and meta["compile_processes"] == 2
    assert meta["env"]["TORCHINDUCTOR_CACHE_DIR"] == str(cache / "inductor")


def test_a_compiler_that_fails_dies_or_hangs_never_takes_down_a_gpu_worker(
    tmp_path: Path, ray_two_gpus: None
) -> None:
    from tests.integration.test_faults import assert_one_row_per_item, planned_ids, write_spec
    from tunectl.orchestrator.submit import submit

    configs = """
    [[configs]]
    compile_ms = 50
    compile_fault = ["raise", "exit", "hang"]
    [[configs]]
    compile_ms = 50
    variant = 7
    """
    spec = write_spec(tmp_path, configs, n=(4, 8))
    options = CompileOptions(2, str(tmp_path / "cache"), timeout_s=10.0)
    out = submit(str(spec), tmp_path / "results", options=RunOptions(compile_options=options))
    rows = assert_one_row_per_item(tmp_path / "results", out.run_id, planned_ids(spec))
    by_fault = {(json.loads(r.config_key).get("compile_fault"), r.status) for r in rows}
    assert by_fault == {
        ("raise", "compile_error"), ("exit", "compile_error"), ("hang", "compile_timeout"), (None, "ok")
    }  # fmt: skip
    messages = {json.loads(r.config_key).get("compile_fault"): r.message for r in rows}
    assert "injected failure" in messages["raise"]
    assert "compiler process died" in messages["exit"]
    assert "longer than 10 s" in messages["hang"]
    failed_on_gpu = [r for r in rows if r.status != "ok" and r.worker]
    assert not failed_on_gpu, "no failed build reached a GPU worker"
    log = (tmp_path / "results" / "_runs" / f"{out.run_id}.log").read_text()
    assert "worker GPU#0 failed" not in log and "worker GPU#1 failed" not in log


def test_a_comparison_goes_on_without_the_arms_whose_kernel_failed_to_build(
    tmp_path: Path, ray_two_gpus: None
) -> None:
    """Held-out shapes compare every config at a point where some are invalid: a build that fails for
    one arm is that arm's record, and the other arms are still timed; a failed baseline fails them all."""
    from tests.integration.test_faults import assert_one_row_per_item, write_spec
    from tunectl.core.plan import comparison
    from tunectl.core.record import Phase
    from tunectl.core.spec import load_spec
    from tunectl.decide.work import FixedItems
    from tunectl.orchestrator.submit import new_run, run

    spec = load_spec(write_spec(tmp_path, '[[configs]]\nfault = "none"\n'))
    good = {"compile_ms": 50}
    arms = [good, {"compile_ms": 50, "compile_fault": "raise"}, {"compile_ms": 50, "variant": 1}]
    static = make_key({})
    items = [
        comparison("fault_injection", static, make_key({"n": n}), tuple(map(make_key, a)), Phase.HOLDOUT, 2)
        for n, a in ((4, arms), (8, [arms[1], good]))
    ]
    results = tmp_path / "results"
    planned = [rid for i in items for rid in i.record_ids()]
    info = new_run(spec, results=results, num_planned=len(planned), kind="holdout")
    out = run(
        lambda pool: FixedItems(items, pool), spec.resources, spec.measure, results=results, info=info,
        options=RunOptions(num_gpus=1, compile_options=CompileOptions(2, str(tmp_path / "cache"))),
    )  # fmt: skip
    rows = assert_one_row_per_item(results, out.run_id, planned)
    statuses = {(json.loads(r.shape_key)["n"], r.config_key): r.status for r in rows}
    assert statuses == {
        (4, '{"compile_ms":50}'): "ok",
        (4, '{"compile_fault":"raise","compile_ms":50}'): "compile_error",
        (4, '{"compile_ms":50,"variant":1}'): "ok",
        (8, '{"compile_fault":"raise","compile_ms":50}'): "compile_error",
        (8, '{"compile_ms":50}'): "compile_error",
    }
    timed = [r for r in rows if r.status == "ok"]
    assert all(r.median_us and r.median_us > 0 for r in timed), "the arms that built were compared"


def test_a_kernel_its_compiler_rejected_is_not_built_again_by_a_later_run(
    tmp_path: Path, ray_two_gpus: None
) -> None:
    """The compile processes of the first run remember it under the cache; those of the second, and a
    worker building for itself, say so at once (``tunectl.measure.build_memory``)."""
    from tests.integration.test_faults import assert_one_row_per_item, planned_ids, write_spec
    from tunectl.orchestrator.submit import submit

    configs = (
        '[[configs]]\ncompile_ms = 300\ncompile_fault = "reject"\n[[configs]]\ncompile_ms = 50\nvariant = 3\n'
    )
    spec = write_spec(tmp_path, configs, n=(4, 8))
    cache = str(tmp_path / "cache")
    said: dict[str, set[tuple[str, str]]] = {}
    for name, workers in (("first", 2), ("second", 2), ("workers alone", 0)):
        options = RunOptions(compile_options=CompileOptions(workers, cache))
        out = submit(str(spec), tmp_path / name, options=options)
        rows = assert_one_row_per_item(tmp_path / name, out.run_id, planned_ids(spec))
        rejected = [r for r in rows if json.loads(r.config_key).get("compile_fault")]
        said[name] = {(r.status, r.message.split(":", 1)[0]) for r in rejected}
        assert {r.status for r in rows if r not in rejected} == {"ok"}
    assert said["first"] == {("compile_error", "CompilationError")}
    assert said["second"] == {("compile_error", "RememberedFailure")}
    assert said["workers alone"] == {("error", "RememberedFailure")}
    assert builds_logged(Path(cache)) == Counter({k: 1 for k in builds_logged(Path(cache))}), (
        "built once each"
    )
