"""FlexAttention decode kernels built ahead into packages, on the CPU: a compile process's build of a
Flex config writes a package whose call holds the page-pool views, the paged block mask, the mask and
score functions; a worker's prepare loads it without Dynamo and gives the reference's answer, for
every mask variant; what cannot be packaged is still built and judged the way it was."""

from __future__ import annotations

import gc
import shutil
import weakref
from typing import Any

import pytest

from tests.decode_keys import flash_static
from tunectl.tasks import _flex, _flex_packages
from tunectl.tasks.base import InvalidConfig
from tunectl.tasks.compile import CACHE_ENV, build
from tunectl.tasks.flash_decode import FlashDecode

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
    pytest.mark.skipif(
        shutil.which("g++") is None and shutil.which("c++") is None, reason="needs a C++ compiler"
    ),
]

STATIC = flash_static(dtype="float32", head_dim=16, num_kv_heads=2, num_q_heads=8, page_size=8)
SHAPE = {"batch": 3, "kv_len": 37, "q_len": 1}
FLEX = {"backend": "flex"}
VARIANTS = {  # the mask and score functions a package must carry
    "plain": {},
    "window and softcap": {"window": (9, 0), "softcap": 4.0},
    "not causal, two queries": {"causal": False, "window": (5, -1)},
}


def captured() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def package(static: dict[str, Any], shape: dict[str, Any]) -> Any:
    task = FlashDecode()
    path = _flex_packages.aot_package(task.name, task.compile_key(static, shape, FLEX), "cpu")
    assert path is not None
    return path


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_built_decode_package_loads_without_tracing_and_matches_the_reference(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    static = {**STATIC, **VARIANTS[variant]}
    shape = {**SHAPE, "q_len": 2} if "two queries" in variant else SHAPE
    build(FlashDecode(), static, shape, FLEX, "cpu")
    path = package(static, shape)
    assert path.is_file() and _flex_packages.intact(path)

    task = FlashDecode()  # a worker: a new point, nothing loaded or compiled
    _flex._enter(object())
    inputs = task.build_inputs(static, shape, "cpu")
    loaded, traced = _flex.aot_loads["loaded"], captured()
    out = task.prepare(static, shape, FLEX, inputs)()
    assert _flex.aot_loads["loaded"] == loaded + 1
    assert captured() == traced  # Dynamo saw nothing
    torch.testing.assert_close(out, task.reference(static, shape, inputs), atol=1e-5, rtol=1e-5)


def test_without_a_package_the_worker_traces_and_is_right(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the test above counts does count: with packages off, the build makes none and the
    worker's prepare goes through Dynamo."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(_flex.AOT_ENV, "0")
    build(FlashDecode(), STATIC, SHAPE, FLEX, "cpu")
    assert not package(STATIC, SHAPE).exists()
    task = FlashDecode()
    _flex._enter(object())
    inputs = task.build_inputs(STATIC, SHAPE, "cpu")
    loaded, traced = _flex.aot_loads["loaded"], captured()
    out = task.prepare(STATIC, SHAPE, FLEX, inputs)()
    assert _flex.aot_loads["loaded"] == loaded and captured() > traced
    torch.testing.assert_close(out, task.reference(STATIC, SHAPE, inputs), atol=1e-5, rtol=1e-5)


def test_without_a_package_the_call_compiled_is_the_packages_own_graph(
    monkeypatch: pytest.MonkeyPatch, compiled_modules: list[Any]
) -> None:
    """A process outside a run (a confirming or serving one) compiles the module a package is built
    from, in one graph, so it runs the kernels a run's workers timed: compiling ``flex_attention``
    alone, with the pool's views and the mask outside, gave other kernels beside the attention one."""
    monkeypatch.delenv(CACHE_ENV, raising=False)
    task = FlashDecode()
    _flex._enter(object())
    inputs = task.build_inputs(STATIC, SHAPE, "cpu")
    traced = captured()
    out = task.prepare(STATIC, SHAPE, FLEX, inputs)()
    [module] = compiled_modules
    assert type(module).__name__ == "FlexDecodeCall" and captured() == traced + 1, "one graph, the package's"
    torch.testing.assert_close(out, task.reference(STATIC, SHAPE, inputs), atol=1e-5, rtol=1e-5)


def test_a_build_keeps_nothing_of_its_points_inputs(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compile process builds point after point: once a point's inputs are let go, nothing of the
    build holds them (on the H200 a package's capture kept every point's KV cache, 4 GiB each at
    64 x 16384, until compile processes held 35-44 GiB). The package is made and loads."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    task = FlashDecode()
    for batch in (2, 3):
        shape = {**SHAPE, "batch": batch}
        inputs = task.build_inputs(STATIC, shape, "cpu")
        kept = [weakref.ref(inputs[name]) for name in ("q", "k_cache", "v_cache", "page_table")]
        build(task, STATIC, shape, FLEX, "cpu", lambda static, shape, inputs=inputs: inputs)
        assert package(STATIC, shape).is_file()
        del inputs
        gc.collect()
        assert [ref() for ref in kept] == [None] * len(kept)


@pytest.mark.parametrize(
    ("static", "config", "why"),
    [
        ({**STATIC, "sinks": True}, FLEX, "sinks"),
        (STATIC, {**FLEX, "num_warps": 3}, "power of two"),
    ],
)
def test_a_config_flex_cannot_run_is_invalid_in_the_build_and_packages_nothing(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, static: dict[str, Any], config: dict[str, Any], why: str
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    with pytest.raises(InvalidConfig, match=why):
        build(FlashDecode(), static, SHAPE, config, "cpu")
    assert not list(tmp_path.rglob("*.inductor"))


def test_other_backends_build_by_their_first_call_and_package_nothing(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    build(FlashDecode(), STATIC, SHAPE, {"backend": "sdpa"}, "cpu")  # runs; nothing to package
    assert not list(tmp_path.rglob("*.inductor"))
