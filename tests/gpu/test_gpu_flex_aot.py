"""FlexAttention kernels built ahead into packages (Inductor standalone artifacts) on a real GPU (``gpu``
marker): what a compile process builds, a worker loads without Dynamo, with the config's kernel options,
and the output matches the reference; with packages off nothing is packaged. Where loading packages
is broken on the machine, the first test fails with the reason the build recorded (packages off for
the target), after checking the kernel the worker got instead (torch.compile's) is right."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tunectl.tasks import _flex, _flex_packages
from tunectl.tasks.compile import CACHE_ENV, build
from tunectl.tasks.flex_prefill import FlexPrefill

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

STATIC = {
    "dtype": "bfloat16",
    "head_dim": 128,
    "num_kv_heads": 8,
    "num_q_heads": 32,
    "num_docs": 4,
    "window": (-1, -1),
    "mask": "document_causal",
}
SHAPE = {"batch": 1, "seq_len": 2048}
CONFIGS = [
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
]


def package(config: dict[str, Any]) -> Path:
    task = FlexPrefill()
    path = _flex_packages.aot_package(task.name, task.compile_key(STATIC, SHAPE, config), "cuda")
    assert path is not None
    return path


def launched_warps(path: Path) -> set[int]:
    """The warp counts the package's generated Triton kernels are compiled with (its code is in it)."""
    return {int(m.group(1)) for m in re.finditer(rb"num_warps=(\d+)", path.read_bytes())}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"M{c['BLOCK_M']}N{c['BLOCK_N']}w{c['num_warps']}")
def test_a_built_package_loads_without_dynamo_with_its_options_and_is_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: dict[str, Any]
) -> None:
    from torch._dynamo.utils import counters

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    build(FlexPrefill(), STATIC, SHAPE, config, "cuda:0")
    task = FlexPrefill()
    _flex._enter(object())
    inputs = task.build_inputs(STATIC, SHAPE, "cuda")
    loaded, captured = _flex.aot_loads["loaded"], counters["stats"]["unique_graphs"]
    out = task.prepare(STATIC, SHAPE, config, inputs)()
    torch.cuda.synchronize()
    # whichever way the build went, the kernel a worker gets is right
    torch.testing.assert_close(out, task.reference(STATIC, SHAPE, inputs), **_tol(task))

    path = package(config)
    markers = [m.read_text() for m in path.parent.glob("unusable-*.txt")]
    assert not markers, f"packages are off on this machine: {markers[0]}"
    assert path.is_file()
    # the package, what names it, and the mark that this target's first package ran in a process of its own
    proven = _flex_packages._marker(task.name, "cuda:0", "proven").name
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, f"{path.name}.json", proven])
    assert config["num_warps"] in launched_warps(path), launched_warps(path)
    assert _flex.aot_loads["loaded"] == loaded + 1
    assert counters["stats"]["unique_graphs"] == captured  # no Dynamo tracing


def test_packages_off_builds_for_torch_compile_and_packages_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(_flex.AOT_ENV, "0")
    build(FlexPrefill(), STATIC, SHAPE, CONFIGS[0], "cuda:0")
    assert not package(CONFIGS[0]).parent.exists()
    task = FlexPrefill()
    _flex._enter(object())
    inputs = task.build_inputs(STATIC, SHAPE, "cuda")
    loaded = _flex.aot_loads["loaded"]
    out = task.prepare(STATIC, SHAPE, CONFIGS[0], inputs)()
    assert _flex.aot_loads["loaded"] == loaded
    torch.testing.assert_close(out, task.reference(STATIC, SHAPE, inputs), **_tol(task))


def test_a_damaged_package_leaves_the_worker_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    path = package(CONFIGS[0])
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a package")
    task = FlexPrefill()
    _flex._enter(object())
    inputs = task.build_inputs(STATIC, SHAPE, "cuda")
    failed = _flex.aot_loads["failed"]
    out = task.prepare(STATIC, SHAPE, CONFIGS[0], inputs)()
    assert _flex.aot_loads["failed"] == failed + 1
    torch.testing.assert_close(out, task.reference(STATIC, SHAPE, inputs), **_tol(task))


def _tol(task: FlexPrefill) -> dict[str, float]:
    atol, rtol = task.tolerance(STATIC)
    return {"atol": atol, "rtol": rtol}
