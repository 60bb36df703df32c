"""Every decode backend and the Flex prefill on a real GPU, through the runner (``gpu`` marker).

Small points, so the whole file runs in about a minute (most of it flash-attn-4 and Inductor compiles),
plus FlashInfer's two JIT builds where its cache is still empty.
Each case goes the way a tuning run does: inputs, reference check, graph or eager timing, NVML state.
"""

from __future__ import annotations

from typing import Any

import pytest

from tunectl.core.keys import make_key
from tunectl.core.plan import WorkItem, item_id
from tunectl.core.spec import L2, MeasureMode, MeasureSpec

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

DECODE = {
    "causal": True,
    "dtype": "bfloat16",
    "head_dim": 128,
    "num_kv_heads": 8,
    "num_q_heads": 32,
    "sinks": False,
    "softcap": 0.0,
    "window": (-1, -1),
}
PREFILL = {
    "dtype": "bfloat16",
    "head_dim": 128,
    "num_kv_heads": 8,
    "num_q_heads": 32,
    "num_docs": 1,
    "window": (-1, -1),
    "mask": "causal",
}
SETTINGS = MeasureSpec(
    warmup=2,
    min_samples=10,
    max_samples=200,
    noise_target=0.02,
    max_seconds=0.2,
    l2=L2.COLD,
    mode=MeasureMode.AUTO,
)
# (config, statuses it may end in on an H200 with the staged packages)
DECODE_CASES: list[tuple[dict[str, Any], tuple[str, ...]]] = [
    ({"backend": "fa4"}, ("ok",)),
    ({"backend": "fa4", "pack_gqa": False}, ("ok",)),
    ({"backend": "fa4", "num_splits": 0}, ("ok", "invalid")),
    ({"backend": "fa4", "num_splits": 4}, ("invalid",)),  # SM90: no split-KV in flash-attn-4
    ({"backend": "fa2", "kv_page_size": 256}, ("ok",)),
    ({"backend": "fa2", "kv_page_size": 256, "num_splits": 1}, ("ok",)),
    ({"backend": "fa2", "kv_page_size": 256, "num_splits": 16}, ("ok",)),
    ({"backend": "fa2"}, ("invalid",)),  # page size not a multiple of 256, and no re-paging asked
    ({"backend": "sdpa"}, ("ok",)),
    ({"backend": "sdpa", "sdpa_backend": "cudnn", "sdpa_gqa": "expand"}, ("ok", "invalid")),
    ({"backend": "sdpa", "sdpa_backend": "flash"}, ("ok", "invalid")),
    ({"backend": "sdpa", "sdpa_backend": "efficient", "sdpa_gqa": "expand"}, ("ok", "invalid")),
    ({"backend": "flex"}, ("ok",)),
    ({"backend": "flex", "num_warps": 4, "num_stages": 2}, ("ok",)),
    ({"backend": "flex", "SPLIT_KV": 8}, ("ok",)),
    ({"backend": "triton"}, ("ok",)),
    ({"backend": "triton", "split_rule": "one_wave"}, ("ok",)),
    ({"backend": "triton", "num_kv_splits": 1, "BLOCK_N": 64, "BLOCK_H": 16}, ("ok",)),
    ({"backend": "triton", "num_kv_splits": 16, "BLOCK_N": 32, "BLOCK_H": 4, "num_stages": 3}, ("ok",)),
    ({"backend": "triton", "num_kv_splits": 64, "BLOCK_N": 64, "num_warps": 8}, ("ok",)),
    # flash-attn 3 built for SM90 (hdim 128, bf16) on the path; without it the failed import is recorded
    ({"backend": "fa3"}, ("ok",)),
    ({"backend": "fa3", "num_splits": 16}, ("ok",)),
    ({"backend": "flashinfer"}, ("ok",)),
    ({"backend": "flashinfer", "use_tensor_cores": True}, ("ok",)),
    # its CUDA-graph plan refuses 8-page splits at 4 x 4096 in pages of 16 (more work units than its grid)
    ({"backend": "flashinfer", "use_tensor_cores": True, "fixed_split_size": 8}, ("ok", "invalid")),
    ({"backend": "flashinfer", "fixed_split_size": 8}, ("invalid",)),  # tensor-core path only
]


def _run(runner: Any, task: str, static: dict, shape: dict, config: dict) -> Any:
    keys = make_key(static), make_key(shape), make_key(config)
    item = WorkItem(item_id(task, *keys), task, *keys, False)
    [record] = runner.run("gpu-smoke", item, SETTINGS)
    return record


def _show(label: str, rec: Any) -> None:
    median = f"{rec.median_us:9.1f} us" if rec.median_us else " " * 12
    print(
        f"{label:<70} {rec.status:<8} {median} mode={rec.measure_mode} clock={rec.sm_clock_mhz} "
        f"T={rec.temperature_c} P={rec.power_w} thr={rec.throttled} err={rec.max_abs_err} "
        f"{rec.message[:160]!r}"
    )


@pytest.mark.parametrize("page_size", [16, 128])
def test_every_decode_backend_runs_or_is_recorded_honestly(page_size: int) -> None:
    from tunectl.measure.runner import ItemRunner

    runner = ItemRunner("cuda:0")
    static, shape = {**DECODE, "page_size": page_size}, {"batch": 4, "kv_len": 4096, "q_len": 1}
    failures = []
    for config, allowed in DECODE_CASES:
        rec = _run(runner, "flash_decode", static, shape, config)
        _show(f"decode p{page_size} {config}", rec)
        if rec.status not in allowed:
            failures.append((config, rec.status, rec.message[:300]))
        if rec.status == "ok":
            assert rec.measure_mode == "graph" and rec.l2 == "cold" and rec.sm_clock_mhz
    assert not failures, failures


def test_decode_with_sinks_window_and_softcap_on_flash_attn_4() -> None:
    from tunectl.measure.runner import ItemRunner

    runner = ItemRunner("cuda:0")
    static = {**DECODE, "page_size": 128, "sinks": True, "softcap": 30.0, "window": (1023, 0)}
    for config in ({"backend": "fa4"}, {"backend": "flex"}):
        rec = _run(runner, "flash_decode", static, {"batch": 2, "kv_len": 3000, "q_len": 2}, config)
        _show(f"decode sinks/window/softcap {config}", rec)
        assert rec.status == ("ok" if config["backend"] == "fa4" else "invalid"), rec.message


@pytest.mark.parametrize("page_size", [1, 16, 128])
def test_the_triton_decode_kernel_matches_the_reference_at_several_shapes(page_size: int) -> None:
    from tunectl.measure.runner import ItemRunner

    runner = ItemRunner("cuda:0")
    static = {**DECODE, "page_size": page_size}
    shapes = [(1, 32768, 1), (4, 8192, 1), (16, 1000, 1), (3, 4097, 4)]
    configs: list[dict[str, Any]] = [
        {"backend": "triton"},
        {"backend": "triton", "num_kv_splits": 32, "BLOCK_N": 32},
    ]
    for batch, kv_len, q_len in shapes:
        for config in configs:
            shape = {"batch": batch, "kv_len": kv_len, "q_len": q_len}
            rec = _run(runner, "flash_decode", static, shape, config)
            _show(f"triton p{page_size} {batch}x{kv_len} q{q_len} {config}", rec)
            assert rec.status == "ok", rec.message  # ok: checked against the reference first


def test_the_triton_decode_kernel_takes_sinks_window_and_softcap() -> None:
    from tunectl.measure.runner import ItemRunner

    runner = ItemRunner("cuda:0")
    static = {**DECODE, "page_size": 16, "sinks": True, "softcap": 30.0, "window": (1023, 0)}
    for config in ({"backend": "triton"}, {"backend": "triton", "num_kv_splits": 1}):
        rec = _run(runner, "flash_decode", static, {"batch": 2, "kv_len": 3000, "q_len": 2}, config)
        _show(f"triton sinks/window/softcap {config}", rec)
        assert rec.status == "ok", rec.message


@pytest.mark.parametrize("mask", ["causal", "document_causal", "sliding_window"])
def test_flex_prefill_compiles_checks_and_times(mask: str) -> None:
    from tunectl.measure.runner import ItemRunner
    from tunectl.tasks._flex import available_backends

    runner = ItemRunner("cuda:0")
    static = {
        **PREFILL,
        "mask": mask,
        "num_docs": 4 if mask == "document_causal" else 1,
        "window": (511, 0) if mask == "sliding_window" else (-1, -1),
    }
    print(f"BACKEND values offered by this torch: {available_backends()}")
    for config in (
        {},
        {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
        {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "USE_TMA": True},
    ):
        rec = _run(runner, "flex_prefill", static, {"batch": 1, "seq_len": 2048}, config)
        _show(f"prefill {mask} {config}", rec)
        assert rec.status == "ok" and rec.measure_mode == "eager", rec.message
    if "FLASH" in available_backends():  # experimental in torch: record what it does, pass or fail
        rec = _run(runner, "flex_prefill", static, {"batch": 1, "seq_len": 2048}, {"BACKEND": "FLASH"})
        _show(f"prefill {mask} BACKEND=FLASH", rec)
