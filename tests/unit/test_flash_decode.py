"""The flash_decode task on CPU: SDPA and FlexAttention configs against the reference, and its rules."""

from __future__ import annotations

import pytest

from tests.decode_keys import flash_static
from tunectl.core.keys import make_key
from tunectl.core.plan import item_id
from tunectl.core.spec import MeasureSpec
from tunectl.tasks.base import InvalidConfig
from tunectl.tasks.flash_decode import BACKEND_DEFAULTS, BACKEND_OPTIONS, FlashDecode, visible
from tunectl.tasks.registry import get_task

torch = pytest.importorskip("torch")
# CPU tests run Flex eagerly (tasks compile it everywhere else); torch warns about that on each call.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

STATIC = flash_static(dtype="float32", head_dim=16, num_kv_heads=2, num_q_heads=8, page_size=8)
SHAPE = {"batch": 3, "kv_len": 37, "q_len": 1}
VARIANTS = {
    "plain": {},
    "window": {"window": (9, 0)},
    "softcap": {"softcap": 4.0},
    "not_causal_window": {"causal": False, "window": (5, -1)},
}


def _task() -> FlashDecode:
    return FlashDecode(compile_flex_on_cpu=False)


def _run(task: FlashDecode, static: dict, shape: dict, config: dict) -> tuple[object, object]:
    inputs = task.build_inputs(static, shape, "cpu")
    return task.prepare(static, shape, config, inputs)(), task.reference(static, shape, inputs)


@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_flex_decode_over_the_page_pool_matches_the_reference(variant: str, q_len: int) -> None:
    static, shape = {**STATIC, **VARIANTS[variant]}, {**SHAPE, "q_len": q_len}
    out, ref = _run(_task(), static, shape, {"backend": "flex"})
    assert out.shape == ref.shape == (3, q_len, 8, 16)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "config",
    [
        {"backend": "sdpa"},
        {"backend": "sdpa", "sdpa_backend": "math", "sdpa_gqa": "expand"},
        {"backend": "sdpa", "sdpa_backend": "flash"},
    ],
)
@pytest.mark.parametrize("q_len", [1, 4])
def test_sdpa_over_gathered_pages_matches_the_reference(config: dict, q_len: int) -> None:
    for variant in ("plain", "window"):
        static = {**STATIC, **VARIANTS[variant]}
        out, ref = _run(_task(), static, {**SHAPE, "q_len": q_len}, config)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_sinks_add_one_logit_per_head_to_the_softmax_denominator() -> None:
    task = _task()
    static = {**STATIC, "sinks": True}
    inputs = task.build_inputs(static, SHAPE, "cpu")
    with_sinks = task.reference(static, SHAPE, inputs)
    without = task.reference(STATIC, SHAPE, {**inputs, "sinks": None})
    # A sink only rescales each head's output by sum(exp(s)) / (sum(exp(s)) + exp(sink)), in (0, 1).
    ratio = (with_sinks / without).flatten(0, 1)
    assert bool(((ratio > 0) & (ratio < 1)).all())
    assert torch.allclose(ratio, ratio[..., :1].expand_as(ratio), atol=1e-4)


def test_the_block_mask_lists_exactly_the_pages_each_sequence_sees() -> None:
    from tunectl.tasks._adapters_torch import paged_block_mask

    for variant in VARIANTS.values():
        for q_len in (1, 5):
            static, shape = {**STATIC, **variant}, {**SHAPE, "kv_len": 41, "q_len": q_len}
            inputs = _task().build_inputs(static, shape, "cpu")
            bm = paged_block_mask(static, inputs)
            page, num_pages = inputs["k_cache"].shape[1], inputs["k_cache"].shape[0]
            slots = torch.arange(num_pages * page)
            for b in range(shape["batch"]):
                dense = bm.mask_mod(torch.tensor(b), 0, torch.arange(q_len)[:, None], slots[None, :])
                seen = dense.view(q_len, num_pages, page)
                partial = set(bm.kv_indices[b, 0, 0, : bm.kv_num_blocks[b, 0, 0]].tolist())
                full = set(bm.full_kv_indices[b, 0, 0, : bm.full_kv_num_blocks[b, 0, 0]].tolist())
                assert not partial & full
                assert {p for p in range(num_pages) if seen[:, p].any()} <= partial | full
                assert all(bool(seen[:, p].all()) for p in full)
                # slot by slot, the mask says what `visible` says of the position the slot holds
                expected = torch.zeros(q_len, num_pages * page, dtype=torch.bool)
                want = visible(static, shape["kv_len"], q_len, "cpu")
                for logical, physical in enumerate(inputs["page_table"][b].tolist()):
                    span = want[:, logical * page : (logical + 1) * page]
                    expected[:, physical * page : physical * page + span.shape[1]] = span
                assert torch.equal(dense, expected)


def test_the_page_table_holds_every_benchmarked_token_and_no_more_pages() -> None:
    task = _task()
    for kv_len, page in ((1, 8), (8, 8), (9, 8), (100, 16)):
        static, shape = {**STATIC, "page_size": page}, {**SHAPE, "kv_len": kv_len}
        inputs = task.build_inputs(static, shape, "cpu")
        capacity = inputs["page_table"].shape[1] * page
        assert kv_len <= capacity < kv_len + page
        assert inputs["seqused_k"].tolist() == [kv_len] * shape["batch"]
        assert sorted(inputs["page_table"].flatten().tolist()) == list(range(inputs["k_cache"].shape[0]))


def test_points_too_large_or_inconsistent_are_skipped_with_a_reason() -> None:
    task = _task()
    big = {**STATIC, "dtype": "bfloat16", "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128}
    assert task.check_point(big, {"batch": 64, "kv_len": 32768, "q_len": 1}) is None
    assert "GiB" in task.check_point(big, {"batch": 128, "kv_len": 32768, "q_len": 1})
    assert "q_len" in task.check_point(STATIC, {**SHAPE, "q_len": 64})
    assert "multiple" in task.check_point({**STATIC, "num_kv_heads": 3}, SHAPE)


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"backend": "nope"}, "backend must be"),
        ({"backend": "sdpa", "num_splits": 2}, "num_splits"),
        ({"backend": "fa4", "pack_gqa": True}, "CUDA"),
        ({"backend": "fa2", "kv_page_size": 256}, "CUDA"),
        ({"backend": "sdpa", "sdpa_backend": "tensorrt"}, "sdpa_backend"),
        ({"backend": "sdpa", "sdpa_backend": "cudnn"}, "cudnn"),
        ({"backend": "flex", "BLOCK_N": 16}, "BLOCK_N=16"),
        ({"backend": "flex", "BACKEND": "NOT_A_BACKEND"}, "BACKEND"),
        ({"backend": "flex", "num_warps": 3}, "power of two"),
    ],
)
def test_configs_a_backend_cannot_take_here_are_invalid(config: dict, why: str) -> None:
    task = _task()
    inputs = task.build_inputs(STATIC, SHAPE, "cpu")
    with pytest.raises(InvalidConfig, match=why):
        task.prepare(STATIC, SHAPE, config, inputs)()  # in prepare, or on the first call at the latest


def test_prepare_leaves_the_device_alone_until_the_first_call() -> None:
    task = _task()
    inputs = task.build_inputs(STATIC, SHAPE, "cpu")
    flex = task.prepare(STATIC, SHAPE, {"backend": "flex"}, inputs)
    assert inputs["derived"] == {}  # the block mask is made by the first call, not by prepare
    flex()
    assert set(inputs["derived"]) == {"flex", "page_maps"}


def test_sinks_and_softcap_are_invalid_where_a_backend_has_none() -> None:
    task = _task()
    for static, config in (
        ({**STATIC, "sinks": True}, {"backend": "sdpa"}),
        ({**STATIC, "sinks": True}, {"backend": "flex"}),
        ({**STATIC, "softcap": 3.0}, {"backend": "sdpa"}),
    ):
        with pytest.raises(InvalidConfig):
            task.prepare(static, SHAPE, config, task.build_inputs(static, SHAPE, "cpu"))


def test_the_default_is_flash_attn_4_as_its_signature_leaves_it() -> None:
    task = get_task("flash_decode")
    assert task.default_config(STATIC) == {"backend": "fa4"} == BACKEND_DEFAULTS["fa4"]
    assert set(BACKEND_DEFAULTS) == set(BACKEND_OPTIONS)
    for backend, config in BACKEND_DEFAULTS.items():
        assert config["backend"] == backend and set(config) - {"backend"} <= set(BACKEND_OPTIONS[backend])
    assert task.serving_mode == "graph"


def test_bytes_moved_counts_the_kv_a_window_lets_the_kernel_read() -> None:
    task = _task()
    shape = {"batch": 2, "kv_len": 1000, "q_len": 1}
    full, windowed = task.bytes_moved(STATIC, shape), task.bytes_moved({**STATIC, "window": (99, 0)}, shape)
    kv_per_token = 2 * 2 * 2 * 16 * 4  # batch, K and V, kv heads, head dim, float32
    assert full - windowed == pytest.approx(kv_per_token * 900, rel=0.01)


def test_the_runner_records_sdpa_as_ok_and_flash_attn_on_cpu_as_invalid() -> None:
    from tunectl.core.plan import WorkItem
    from tunectl.measure.runner import ItemRunner

    runner = ItemRunner("cpu")
    runner._tasks["flash_decode"] = _task()
    static, shape = make_key(STATIC), make_key(SHAPE)
    settings = MeasureSpec(warmup=1, min_samples=3, max_samples=5, max_seconds=0.2)
    records = {}
    for config in ({"backend": "sdpa"}, {"backend": "flex"}, {"backend": "fa4"}):
        key = make_key(config)
        item = WorkItem(
            item_id("flash_decode", static, shape, key),
            "flash_decode",
            static,
            shape,
            key,
            config == {"backend": "fa4"},
        )
        [records[config["backend"]]] = runner.run("r1", item, settings)
    assert records["sdpa"].status == "ok" and records["sdpa"].median_us > 0
    assert records["flex"].status == "ok" and records["flex"].max_abs_err < 1e-5
    assert records["fa4"].status == "invalid" and "CUDA" in records["fa4"].message
    assert records["sdpa"].measure_mode == "eager" and records["sdpa"].sm_clock_mhz is None
