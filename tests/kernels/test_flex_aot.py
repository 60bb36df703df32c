"""FlexAttention kernels built ahead into packages (Inductor standalone artifacts), on the CPU (Inductor
compiles flex for the CPU too): a build writes the package under the compile cache, a prepare loads it
without Dynamo, and a missing, damaged or foreign package leaves the worker on the torch.compile way,
still right."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tunectl.tasks import _flex, _flex_packages
from tunectl.tasks.compile import CACHE_ENV, build
from tunectl.tasks.flex_prefill import FlexPrefill, make_mask_mod

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
    pytest.mark.skipif(
        shutil.which("g++") is None and shutil.which("c++") is None, reason="needs a C++ compiler"
    ),
]

STATIC = {
    "dtype": "float32",
    "head_dim": 16,
    "num_kv_heads": 2,
    "num_q_heads": 4,
    "num_docs": 3,
    "window": (-1, -1),
    "mask": "document_causal",
}
SHAPE = {"batch": 2, "seq_len": 256}
CONFIG = {"BLOCK_M": 64, "BLOCK_N": 32}
OTHER = {"BLOCK_M": 64, "BLOCK_N": 64}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A compile cache holding the package of CONFIG, built once for the module."""
    root = tmp_path_factory.mktemp("compile-cache")
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(root)
    try:
        build(FlexPrefill(aot=True), STATIC, SHAPE, CONFIG, "cpu")
        yield root
    finally:
        if before is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = before


def package(config: dict[str, Any]) -> Path:
    task = FlexPrefill()
    path = _flex_packages.aot_package(task.name, task.compile_key(STATIC, SHAPE, config), "cpu")
    assert path is not None
    return path


def meta_of(path: Path) -> Path:
    return path.with_name(f"{path.name}.json")


def run(task: FlexPrefill, config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Prepare and call ``config`` on a new point's inputs, as a worker does; (output, inputs)."""
    _flex._enter(object())  # a worker arriving at the point: nothing compiled or loaded yet
    inputs = task.build_inputs(STATIC, SHAPE, "cpu")
    return task.prepare(STATIC, SHAPE, config, inputs)(), inputs


def captured() -> int:
    """Graphs Dynamo has captured in this process."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def test_a_build_writes_one_package_named_by_the_compile_key(cache: Path) -> None:
    path = package(CONFIG)
    assert path.is_file() and path.is_relative_to(cache / "flex_prefill" / "aot")
    # the artifact and its JSON, no temp file left beside them (and the mark of a target proven)
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.startswith("proven-")) == [
        path.name, f"{path.name}.json",
    ]  # fmt: skip
    assert package(OTHER) != path  # another option set, another package
    meta = json.loads(meta_of(path).read_text())
    assert meta["key"] == FlexPrefill().compile_key(STATIC, SHAPE, CONFIG)
    assert sorted(meta["inputs"]) == list(range(8))  # q, k, v, document ids, 4 block-mask tensors
    assert _flex_packages.intact(path)


def test_a_prepare_loads_the_package_without_tracing_and_matches_the_reference(cache: Path) -> None:
    task = FlexPrefill(aot=True)
    loaded, traced = _flex.aot_loads["loaded"], captured()
    out, inputs = run(task, CONFIG)
    assert _flex.aot_loads["loaded"] == loaded + 1
    assert captured() == traced  # Dynamo saw nothing
    torch.testing.assert_close(out, task.reference(STATIC, SHAPE, inputs), atol=1e-5, rtol=1e-5)


def test_with_packages_off_the_same_prepare_traces(cache: Path) -> None:
    """What the test above counts does count: the torch.compile way goes through Dynamo."""
    task = FlexPrefill(aot=False)
    loaded, traced = _flex.aot_loads["loaded"], captured()
    out, inputs = run(task, CONFIG)
    assert _flex.aot_loads["loaded"] == loaded and captured() > traced
    torch.testing.assert_close(out, task.reference(STATIC, SHAPE, inputs), atol=1e-5, rtol=1e-5)


def test_with_packages_off_the_call_compiled_is_the_packages_own_graph(
    cache: Path, compiled_modules: list[Any]
) -> None:
    """The torch.compile way compiles the module a package is built from, in one graph (with the
    block mask made inside it), so a process without packages runs the kernels the workers timed."""
    task = FlexPrefill(aot=False)
    traced = captured()
    out, inputs = run(task, CONFIG)
    [module] = compiled_modules
    assert type(module).__name__ == "FlexCall" and captured() == traced + 1
    torch.testing.assert_close(out, task.reference(STATIC, SHAPE, inputs), atol=1e-5, rtol=1e-5)


def test_a_second_build_keeps_the_package_it_finds(cache: Path) -> None:
    path = package(CONFIG)
    inode = path.stat().st_ino
    build(FlexPrefill(aot=True), STATIC, SHAPE, CONFIG, "cpu")
    assert path.stat().st_ino == inode


@pytest.mark.parametrize("damage", ["missing", "no JSON", "garbage", "truncated", "another kernel's"])
def test_a_package_that_is_not_there_or_not_this_kernels_leaves_the_worker_compiling(
    cache: Path, damage: str
) -> None:
    path = package(OTHER)
    good = package(CONFIG)
    if damage != "missing":  # CONFIG's package where OTHER's belongs: its JSON names CONFIG's kernel
        path.write_bytes(good.read_bytes())
        if damage != "no JSON":
            meta_of(path).write_bytes(meta_of(good).read_bytes())
    if damage == "garbage":
        path.write_bytes(b"not a package")
    elif damage == "truncated":
        path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    task = FlexPrefill(compile_on_cpu=False, aot=True)  # the fallback runs flex eagerly: quick
    before = dict(_flex.aot_loads)
    try:
        out, inputs = run(task, OTHER)
    finally:
        path.unlink(missing_ok=True)
        meta_of(path).unlink(missing_ok=True)
    outcome = "absent" if damage == "missing" else "failed"
    assert _flex.aot_loads[outcome] == before.get(outcome, 0) + 1
    assert _flex.aot_loads["loaded"] == before.get("loaded", 0)
    torch.testing.assert_close(out, task.reference(STATIC, SHAPE, inputs), atol=1e-5, rtol=1e-5)


def test_a_damaged_or_foreign_package_is_refused_with_the_reason(cache: Path, tmp_path: Path) -> None:
    key = FlexPrefill().compile_key(STATIC, SHAPE, CONFIG)
    copy = tmp_path / package(CONFIG).name
    copy.write_bytes(package(CONFIG).read_bytes()[:-1] + b"x")
    meta_of(copy).write_bytes(meta_of(package(CONFIG)).read_bytes())
    assert not _flex_packages.intact(copy)
    with pytest.raises(ValueError, match="damaged"):
        _flex_packages.load_package(copy, key, "cpu")


def test_a_package_for_another_kernel_is_refused_by_name(cache: Path) -> None:
    with pytest.raises(ValueError, match="another kernel"):
        _flex_packages.load_package(package(CONFIG), "some other key", "cpu")


def test_the_check_in_a_process_of_its_own_passes_a_good_package_and_fails_a_wrong_one(cache: Path) -> None:
    request = {"task": "flex_prefill", "static": STATIC, "shape": SHAPE, "config": CONFIG,
               "path": str(package(CONFIG)), "device": "cpu"}  # fmt: skip
    _flex_packages.check_package({**request, "key": FlexPrefill().compile_key(STATIC, SHAPE, CONFIG)})
    with pytest.raises(RuntimeError, match=r"failed its check: ValueError: .*another kernel"):
        _flex_packages.check_package({**request, "key": "some other key"})


_SEGFAULT = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
_HANG = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.mark.parametrize("loader", ["crashes", "hangs"])
def test_a_load_that_kills_or_hangs_its_process_turns_packages_off_for_the_target(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loader: str
) -> None:
    """Loading a package crashing its process (as seen on an H200 with torch 2.11) or hanging, stood
    in for by a check command that does so: nothing is published, the build goes the torch.compile
    way, later builds make no package, and workers load none, even one that is there."""
    import torch._inductor

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(_flex_packages, "CHECK_COMMAND", _SEGFAULT if loader == "crashes" else _HANG)
    monkeypatch.setattr(_flex_packages, "CHECK_TIMEOUT_S", 3.0)
    compiles: list[Any] = []
    real = torch._inductor.standalone_compile

    def counted(graph: Any, example_inputs: Any, **kwargs: Any) -> Any:
        compiles.append(graph)
        return real(graph, example_inputs, **kwargs)

    monkeypatch.setattr(torch._inductor, "standalone_compile", counted)
    task = FlexPrefill(compile_on_cpu=False, aot=True)
    build(task, STATIC, SHAPE, CONFIG, "cpu")
    assert len(compiles) == 1 and not package(CONFIG).exists()
    assert not _flex_packages.usable(task.name, "cpu")
    (marker,) = package(CONFIG).parent.glob("unusable-*.txt")
    assert ("SIGSEGV" if loader == "crashes" else "did not finish") in marker.read_text()

    build(task, STATIC, SHAPE, OTHER, "cpu")
    assert len(compiles) == 1  # no second try on this target
    built = cache / package(CONFIG).relative_to(tmp_path)  # a package from before: not loaded either
    shutil.copy(built, package(CONFIG))
    shutil.copy(meta_of(built), meta_of(package(CONFIG)))
    assert _flex_packages.intact(package(CONFIG))
    before = _flex.aot_loads["unusable"]
    out, inputs = run(task, CONFIG)
    assert _flex.aot_loads["unusable"] == before + 1
    torch.testing.assert_close(out, task.reference(STATIC, SHAPE, inputs), atol=1e-5, rtol=1e-5)


def test_the_check_refuses_a_bad_request_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from tunectl.tasks import _aot_check

    assert _aot_check.main(["{not json"]) == 2
    assert _aot_check.main(['{"task": "flex_prefill"}']) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "not JSON" in lines[0] and "missing: static" in lines[1]


def test_a_build_that_finds_a_damaged_package_builds_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    path = package(CONFIG)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"left half-written by hand")
    task = FlexPrefill(aot=True)
    build(task, STATIC, SHAPE, CONFIG, "cpu")
    loaded = _flex.aot_loads["loaded"]
    out, inputs = run(task, CONFIG)
    assert _flex.aot_loads["loaded"] == loaded + 1
    torch.testing.assert_close(out, task.reference(STATIC, SHAPE, inputs), atol=1e-5, rtol=1e-5)


def test_a_failed_package_compile_publishes_nothing_and_builds_the_compiled_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inductor failing on the captured graph (stood in for: it raises) leaves no package and no temp
    file; the build then goes the torch.compile way, as without packages."""
    import torch._inductor

    def broken(graph: Any, example_inputs: Any, **kwargs: Any) -> Any:
        raise RuntimeError("Inductor failed")

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(torch._inductor, "standalone_compile", broken)
    task = FlexPrefill(compile_on_cpu=False, aot=True)
    prepared: list[Any] = []
    original = task.prepare

    def prepare(*args: Any) -> Any:
        prepared.append(args[2])
        return original(*args)

    monkeypatch.setattr(task, "prepare", prepare)
    build(task, STATIC, SHAPE, CONFIG, "cpu")
    assert prepared == [CONFIG]  # built (and run) the torch.compile way instead
    assert list(package(CONFIG).parent.iterdir()) == []


def test_without_a_compile_cache_a_build_makes_no_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert _flex_packages.aot_package("flex_prefill", "key", "cpu") is None
    task = FlexPrefill(compile_on_cpu=False, aot=True)
    build(task, STATIC, SHAPE, CONFIG, "cpu")  # the torch.compile way (here eager): no error
    before = _flex.aot_loads["absent"]
    out, inputs = run(task, CONFIG)
    assert _flex.aot_loads["absent"] == before + 1
    torch.testing.assert_close(out, task.reference(STATIC, SHAPE, inputs), atol=1e-5, rtol=1e-5)


def test_invalid_options_are_refused_before_anything_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tunectl.tasks.base import InvalidConfig

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    with pytest.raises(InvalidConfig, match="does not divide"):
        build(FlexPrefill(aot=True), STATIC, SHAPE, {"BLOCK_M": 256}, "cpu")
    assert list(tmp_path.iterdir()) == []


def test_the_captured_call_carries_the_kernel_options() -> None:
    task = FlexPrefill()
    inputs = task.build_inputs(STATIC, SHAPE, "cpu")
    module = _flex.packageable(
        lambda doc_id: make_mask_mod(STATIC, doc_id),
        128,
        enable_gqa=True,
        options={"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
    )
    graphs: list[Any] = []

    def capture(graph: Any, example_inputs: Any) -> Any:
        graphs.append(graph)
        return graph.forward

    torch.compile(module, backend=capture, fullgraph=True, dynamic=False)(*task.aot_args(STATIC, inputs))
    (node,) = [n for n in graphs[0].graph.nodes if "flex_attention" in str(n.target)]
    options = next(a for a in node.args if isinstance(a, dict))
    assert {k: options[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")} == {
        "BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("env", "option", "wanted"),
    [(None, None, True), ("0", None, False), ("off", None, False), ("1", None, True), ("on", None, True),
     ("0", True, True), ("1", False, False)],
)  # fmt: skip
def test_packages_are_on_by_default_and_switchable(
    monkeypatch: pytest.MonkeyPatch, env: str | None, option: bool | None, wanted: bool
) -> None:
    if env is None:
        monkeypatch.delenv(_flex.AOT_ENV, raising=False)
    else:
        monkeypatch.setenv(_flex.AOT_ENV, env)
    assert _flex.aot_wanted(option) is wanted


def test_the_switch_reaches_workers_and_compile_processes_when_the_driver_sets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tunectl.tasks.compile import cache_env

    monkeypatch.delenv(_flex.AOT_ENV, raising=False)
    assert _flex.AOT_ENV not in cache_env(tmp_path)
    monkeypatch.setenv(_flex.AOT_ENV, "0")
    assert cache_env(tmp_path)[_flex.AOT_ENV] == "0"


def test_after_the_first_package_of_a_target_later_ones_are_checked_in_the_builder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the first package runs the check process; a later one, with that process now one that
    would crash, is still published: its builder loaded and ran it, and it gave the built output."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    task = FlexPrefill(compile_on_cpu=False, aot=True)
    build(task, STATIC, SHAPE, CONFIG, "cpu")
    assert _flex_packages.intact(package(CONFIG)) and list(package(CONFIG).parent.glob("proven-*.txt"))
    monkeypatch.setattr(_flex_packages, "CHECK_COMMAND", _SEGFAULT)
    build(task, STATIC, SHAPE, OTHER, "cpu")
    assert _flex_packages.intact(package(OTHER)) and _flex_packages.usable(task.name, "cpu")


def test_a_later_package_whose_loaded_output_differs_from_its_build_is_not_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The builder's own check can fail: a package whose load computes something else (stood in for:
    the loaded call's output is off by one ulp somewhere) is dropped, and the build compiles instead."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    task = FlexPrefill(compile_on_cpu=False, aot=True)
    build(task, STATIC, SHAPE, CONFIG, "cpu")
    real = _flex_packages.load_package

    def off(path: Path, key: str, device: str) -> Any:
        bind = real(path, key, device)

        def call(*args: Any) -> Any:
            out = bind(*args)()
            return lambda: out.flatten().index_add(0, torch.tensor([7]), torch.tensor([1e-6])).view_as(out)

        return call

    monkeypatch.setattr(_flex_packages, "load_package", off)
    build(task, STATIC, SHAPE, OTHER, "cpu")
    assert (
        not package(OTHER).exists()
        and not (tmp_path / "flex_prefill" / "aot" / f"{package(OTHER).name}.json").exists()
    )
    assert _flex_packages.usable(task.name, "cpu")  # a bad package, not a bad target
    assert "output differs from the kernel it was built from" in caplog.text


def test_a_compile_process_builds_a_package_for_more_shapes_of_one_kernel_than_dynamos_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch._dynamo.config as dynamo_config

    from tunectl.tasks.compile import BUILDER_RECOMPILE_LIMIT

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    torch._dynamo.reset()  # no entries of earlier tests
    task = FlexPrefill(aot=True)
    shapes = [{"batch": 1, "seq_len": 128}, {"batch": 1, "seq_len": 256}]
    # Dynamo's own patch (it restores its config as it was; a plain setattr's undo left the name unreadable)
    with dynamo_config.patch(recompile_limit=1):  # Dynamo's 8, as if 8 shapes were built
        for shape in shapes:
            build(task, STATIC, shape, CONFIG, "cpu")
        raised = dynamo_config.recompile_limit
    built = [
        _flex_packages.aot_package(task.name, task.compile_key(STATIC, s, CONFIG), "cpu") for s in shapes
    ]
    assert all(path is not None and path.is_file() for path in built), "no shape fell back for want of room"
    assert raised >= BUILDER_RECOMPILE_LIMIT


def test_both_ways_compile_with_no_setting_timed_on_the_device(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package is compiled, and a process without packages compiles, under ``pinned_options``:
    Inductor times no launch setting on the device, so a config names one set of kernels in every
    process and cache; a package built under other settings is not the one looked for."""
    seen: list[dict[str, Any]] = []
    real_standalone, real_compile = torch._inductor.standalone_compile, torch.compile

    def standalone(*args: Any, **kwargs: Any) -> Any:
        config = torch._inductor.config
        seen.append({"triton.autotune_pointwise": config.triton.autotune_pointwise})
        if hasattr(config, "deterministic"):
            seen[-1]["deterministic"] = config.deterministic
        return real_standalone(*args, **kwargs)

    def compile_(*args: Any, **kwargs: Any) -> Any:
        seen.append(dict(kwargs.get("options") or {}))
        return real_compile(*args, **kwargs)

    monkeypatch.setattr(torch._inductor, "standalone_compile", standalone)
    monkeypatch.setattr(torch, "compile", compile_)
    pinned = _flex_packages.pinned_options()
    assert pinned["triton.autotune_pointwise"] is False
    build(FlexPrefill(aot=True), STATIC, SHAPE, {"BLOCK_M": 32, "BLOCK_N": 32}, "cpu")
    run(FlexPrefill(aot=False), {"BLOCK_M": 32, "BLOCK_N": 64})
    assert [s for s in seen if s] == [pinned, pinned], "the package's compile, then the compiled way's"
    assert ",".join(f"{k}={v}" for k, v in sorted(pinned.items())) in _flex_packages.aot_target("cpu")
