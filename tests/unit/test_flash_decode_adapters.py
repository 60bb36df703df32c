"""The flash-attn family adapters build the arguments each library's real call declares.

FA3 and sgl-kernel cannot run on the H200 image (no FA3 kernels in the flash-attn sdist; sgl-kernel
0.3.21 needs torch 2.9 / CUDA 12), so their mapping is checked here against the signatures the
libraries document, copied below (names and defaults, bodies elided):

- flash-attn 3: hopper/flash_attn_interface.py, ``flash_attn_with_kvcache``;
- sgl-kernel: python/sgl_kernel/flash_attn.py, ``flash_attn_with_kvcache`` (with ``sinks``);
- flash-attn 2.8.3: flash_attn/flash_attn_interface.py, ``flash_attn_with_kvcache``;
- flash-attn-4 4.0.0b36: flash_attn/cute/interface.py, ``flash_attn_varlen_func``.

Where a library is installed, the same kwargs are also bound to its real function.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import pytest

from tests.decode_keys import flash_static
from tunectl.tasks import _adapters_flash
from tunectl.tasks.base import InvalidConfig

torch = pytest.importorskip("torch")


def fa3_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                     cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                     cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                     q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                     window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                     scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                     return_softmax_lse=False):  # fmt: skip
    ...


def sgl_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                     cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                     cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                     q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                     window_size=(-1, -1), attention_chunk=None, softcap=0.0, rotary_interleaved=True,
                     scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                     return_softmax_lse=False, sinks=None, ver=3):  # fmt: skip
    ...


def fa2_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                     cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                     softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                     rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                     return_softmax_lse=False):  # fmt: skip
    ...


def fa4_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                    max_seqlen_k=None, min_seqlen_k=None, seqused_q=None, seqused_k=None,
                    gather_kv_indices=None, page_table=None, softmax_scale=None, causal=False,
                    window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1,
                    pack_gqa=None, deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None,
                    block_sparse_tensors=None, aux_tensors=None, aux_scalars=None, return_lse=False,
                    scheduler_metadata=None, seqlen_k_per_split=None, disable_scheduler_metadata=False,
                    gather_bwd_recompute_p=False, gather_bwd_token_chunk=None):  # fmt: skip
    ...


DOCUMENTED = {
    "fa3": fa3_with_kvcache,
    "sgl": sgl_with_kvcache,
    "fa2": fa2_with_kvcache,
    "fa4": fa4_varlen_func,
}
REAL = {
    "fa3": ("flash_attn_interface", "flash_attn_with_kvcache"),
    "sgl": ("sgl_kernel.flash_attn", "flash_attn_with_kvcache"),
    "fa2": ("flash_attn", "flash_attn_with_kvcache"),
    "fa4": ("flash_attn.cute", "flash_attn_varlen_func"),
}

STATIC = flash_static(head_dim=16, num_kv_heads=2, num_q_heads=8, page_size=256)
SHAPE = {"batch": 2, "kv_len": 300, "q_len": 1}


def _inputs(static: dict[str, Any]) -> dict[str, Any]:
    from tunectl.tasks.flash_decode import FlashDecode

    return FlashDecode().build_inputs(static, SHAPE, "cpu")


def _bind(backend: str, kwargs: dict[str, Any]) -> inspect.BoundArguments:
    bound = inspect.signature(DOCUMENTED[backend]).bind(**kwargs)
    bound.apply_defaults()
    return bound


@pytest.mark.parametrize("backend", sorted(DOCUMENTED))
def test_every_argument_is_one_the_library_declares(backend: str) -> None:
    static = {**STATIC, "sinks": backend in ("fa4", "sgl"), "window": (64, 0), "softcap": 5.0}
    kwargs = _adapters_flash.KWARGS[backend](
        static,
        {"num_splits": 4, "pack_gqa": False} if backend != "fa2" else {"num_splits": 4},
        _inputs(static),
    )
    args = _bind(backend, kwargs).arguments
    assert args["num_splits"] == 4 and args["causal"] is True and args["softcap"] == 5.0
    assert args["window_size"] == (64, 0)
    if backend != "fa2":
        assert args["pack_gqa"] is False


@pytest.mark.parametrize("backend", ["fa3", "sgl"])
def test_fa3_and_sgl_take_the_pool_the_page_table_and_the_lengths_as_they_are(backend: str) -> None:
    inputs = _inputs({**STATIC, "page_size": 16})
    args = _bind(backend, _adapters_flash.KWARGS[backend]({**STATIC, "page_size": 16}, {}, inputs)).arguments
    assert args["k_cache"] is inputs["k_cache"] and args["v_cache"] is inputs["v_cache"]
    assert args["page_table"] is inputs["page_table"] and args["page_table"].dtype == torch.int32
    assert args["cache_seqlens"] is inputs["seqused_k"] and args["cache_seqlens"].dtype == torch.int32
    assert args["window_size"] == (-1, -1)  # -1: unbounded, their convention
    assert args["num_splits"] == 0 and args["pack_gqa"] is None  # their own defaults when untuned
    assert args["q"].shape == (2, 1, 8, 16)  # (batch, seqlen, nheads, headdim)


def test_sinks_reach_sgl_kernel_and_flash_attn_4_and_are_invalid_for_fa2_and_fa3() -> None:
    static = {**STATIC, "sinks": True}
    inputs = _inputs(static)
    assert _bind("sgl", _adapters_flash.sgl_kwargs(static, {}, inputs)).arguments["sinks"] is inputs["sinks"]
    fa4 = _bind("fa4", _adapters_flash.fa4_kwargs(static, {}, inputs)).arguments
    assert fa4["learnable_sink"] is inputs["sinks"] and fa4["learnable_sink"].shape == (8,)
    for backend in ("fa2", "fa3"):
        with pytest.raises(InvalidConfig, match="sinks"):
            _adapters_flash.KWARGS[backend](static, {}, inputs)


def test_flash_attn_4_uses_none_for_an_unbounded_window_and_its_own_defaults() -> None:
    args = _bind("fa4", _adapters_flash.fa4_kwargs(STATIC, {}, _inputs(STATIC))).arguments
    assert args["window_size"] == (None, None)
    assert args["num_splits"] == 1 and args["pack_gqa"] is None
    assert args["seqused_k"].tolist() == [300, 300] and args["page_table"].shape == (2, 2)


def test_flash_attn_2_refuses_pages_it_cannot_take_unless_told_to_repage() -> None:
    static = {**STATIC, "page_size": 16}
    inputs = _inputs(static)
    with pytest.raises(InvalidConfig, match="multiple of 256"):
        _adapters_flash.fa2_kwargs(static, {}, inputs)
    args = _bind("fa2", _adapters_flash.fa2_kwargs(static, {"kv_page_size": 256}, inputs)).arguments
    assert args["k_cache"].shape[1] == 256 and args["block_table"].shape == (2, 2)
    assert args["num_splits"] == 0  # flash-attn 2.8's own default: its split heuristic


def test_a_repaged_cache_holds_the_same_tokens_in_the_same_order() -> None:
    static = {**STATIC, "dtype": "float32", "page_size": 16}
    inputs = _inputs(static)
    k2, v2, table2 = _adapters_flash.repaged(inputs, 256)
    for cache, new in ((inputs["k_cache"], k2), (inputs["v_cache"], v2)):
        old_tokens = cache[inputs["page_table"].long()].flatten(1, 2)[:, :300]
        new_tokens = new[table2.long()].flatten(1, 2)[:, :300]
        assert torch.equal(old_tokens, new_tokens)
    assert _adapters_flash.repaged(inputs, 256)[0] is k2  # made once per point


@pytest.mark.parametrize("backend", sorted(REAL))
def test_the_installed_library_takes_the_same_arguments(backend: str) -> None:
    module_name, attr = REAL[backend]
    try:
        real = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # not installed here (FA3 and sgl-kernel never are on CPU CI)
        pytest.skip(f"{module_name} not importable: {type(exc).__name__}")
    static = {**STATIC, "sinks": backend in ("fa4", "sgl")}
    config = {"kv_page_size": 256} if backend == "fa2" else {}
    inspect.signature(real).bind(**_adapters_flash.KWARGS[backend](static, config, _inputs(static)))
