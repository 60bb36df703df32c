"""From a looked-up config to the arguments of the kernel call that serving makes. Standard library only.

    from tunectl.runtime import adapters
    call = adapters.call(bundle, "flash_decode", **static, batch=b, kv_len=n, q_len=1)
    if call.backend == "fa2":
        out = flash_attn_with_kvcache(q, k_cache, v_cache, block_table=..., **call.kwargs)

Each task's adapter takes the config a lookup returned, or None for a miss, and returns a ``Call``:
the backend to call (for tasks that choose one), the keyword arguments, whether they came from the
bundle (``tuned``), and what the call needs of the caller's data that is not an argument
(``requires``: flash-attn 2 needs its cache paged in 256-token pages). A miss gives the task's
untuned default call, so serving code has one path. A config this version does not understand (a
backend added later) is treated as a miss and logged, never raised.

- ``flash_decode``: ``fa4`` -> ``flash_attn.cute.flash_attn_varlen_func(num_splits, pack_gqa)``;
  ``fa2`` -> ``flash_attn.flash_attn_with_kvcache(num_splits)``; ``fa3``, ``sgl`` ->
  ``flash_attn_with_kvcache(num_splits, pack_gqa)`` of flash-attn 3 / sgl-kernel; ``sdpa`` ->
  ``scaled_dot_product_attention(enable_gqa)`` under ``requires["sdpa_backend"]``; ``flex`` ->
  ``flex_attention(kernel_options)``; ``triton`` -> the options of ``tunectl.tasks._triton_decode`` as the
  config names them (``num_kv_splits``, ``BLOCK_N``, ``BLOCK_H``, ``num_warps``, ``num_stages``,
  ``split_rule``; an option left out takes ``tunectl.tasks._adapters_triton.DEFAULTS``);
  ``flex_attention(kernel_options)``; ``flashinfer`` -> ``BatchDecodeWithPagedKVCacheWrapper.plan(
  fixed_split_size, disable_split_kv)`` on a wrapper made with ``requires["use_tensor_cores"]`` and
  ``requires["kv_layout"]``;
- ``flex_prefill``: ``flex_attention(kernel_options=...)`` (no argument: Inductor's own choice);
- ``decode_attention``: ``split_kv_decode(inputs, num_splits, gather, gqa)``.

FlexAttention's ``kernel_options`` are written as attention-gym's replay writes them: the per-kernel
tunables of the forward kernel prefixed ``fwd_`` (Inductor strips the prefix for the forward kernel
and leaves the backward kernel its own choice), the options Flex reads before choosing a kernel
(``BACKEND``, ``PRESCALE_QK``, ...) unprefixed, because only their unprefixed form is read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger("tunectl.runtime.adapters")

#: per-kernel Triton tunables: prefixed ``fwd_`` (forward) or, for the backward-only names, ``bwd_``
FLEX_KERNEL_TUNABLES = (
    "BLOCK_M",
    "BLOCK_N",
    "num_warps",
    "num_stages",
    "USE_TMA",
    "SPLIT_KV",
    "kpack",
    "matrix_instr_nonkdim",
    "waves_per_eu",
)
FLEX_BACKWARD_TUNABLES = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")
#: options read once per call, before a kernel is chosen: only their unprefixed form has an effect
FLEX_CALL_OPTIONS = (
    "BACKEND",
    "PRESCALE_QK",
    "ROWS_GUARANTEED_SAFE",
    "BLOCKS_ARE_CONTIGUOUS",
    "FORCE_USE_FLEX_ATTENTION",
    "WRITE_DQ",
)

DECODE_BACKENDS = ("fa4", "fa2", "fa3", "sgl", "sdpa", "flex", "triton", "flashinfer")
TRITON_DECODE_OPTIONS = ("num_kv_splits", "BLOCK_N", "BLOCK_H", "num_warps", "num_stages", "split_rule")


@dataclass(frozen=True)
class Call:
    """What to call and with which keyword arguments."""

    backend: str | None
    kwargs: dict[str, Any]
    tuned: bool
    requires: dict[str, Any] = field(default_factory=dict)


class _Looks(Protocol):
    def lookup(self, task: str, /, **params: Any) -> dict[str, Any] | None: ...


def flex_kernel_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """FlexAttention ``kernel_options`` for a config; names that are not Flex options are left out."""
    options: dict[str, Any] = {}
    for name, value in config.items():
        if name.startswith(("fwd_", "bwd_")) or name in FLEX_CALL_OPTIONS:
            options[name] = value
        elif name in FLEX_KERNEL_TUNABLES:
            options[f"fwd_{name}"] = value
        elif name in FLEX_BACKWARD_TUNABLES:
            options[f"bwd_{name}"] = value
    return dict(sorted(options.items()))


def _flex_call(config: Mapping[str, Any], backend: str | None) -> Call:
    options = flex_kernel_options(config)
    return Call(backend, {"kernel_options": options} if options else {}, tuned=True)


def _default_decode() -> Call:
    return Call("fa4", {"num_splits": 1, "pack_gqa": None}, tuned=False)


def flash_decode(config: Mapping[str, Any] | None) -> Call:
    """The decode call for a ``flash_decode`` config; the untuned flash-attn-4 call on a miss."""
    if config is None:
        return _default_decode()
    backend = config.get("backend")
    if backend == "fa4":
        return Call(
            "fa4", {"num_splits": int(config.get("num_splits", 1)), "pack_gqa": config.get("pack_gqa")}, True
        )
    if backend == "fa2":
        requires = {"kv_page_size": config["kv_page_size"]} if "kv_page_size" in config else {}
        return Call("fa2", {"num_splits": int(config.get("num_splits", 0))}, True, requires)
    if backend in ("fa3", "sgl"):
        kwargs = {"num_splits": int(config.get("num_splits", 0)), "pack_gqa": config.get("pack_gqa")}
        return Call(backend, kwargs, True)
    if backend == "sdpa":
        gqa = config.get("sdpa_gqa", "native")
        requires = {"sdpa_backend": config.get("sdpa_backend"), "expand_kv": gqa == "expand"}
        return Call("sdpa", {"enable_gqa": gqa == "native"}, True, requires)
    if backend == "flex":
        return _flex_call(config, "flex")
    if backend == "triton":
        return Call("triton", {k: config[k] for k in TRITON_DECODE_OPTIONS if k in config}, True)
    if backend == "flashinfer":
        return _flashinfer_call(config)
    log.warning("tunectl: flash_decode config %r names an unknown backend; using the default call", config)
    return _default_decode()


def _flashinfer_call(config: Mapping[str, Any]) -> Call:
    """``plan()``'s split options as kwargs; what the wrapper is made with (its path, the cache layout)
    as ``requires``, since serving makes a wrapper once and plans it every step."""
    kwargs: dict[str, Any] = {}
    if config.get("fixed_split_size") is not None:
        kwargs["fixed_split_size"] = int(config["fixed_split_size"])
    if config.get("disable_split_kv"):
        kwargs["disable_split_kv"] = True
    requires = {
        "use_tensor_cores": bool(config.get("use_tensor_cores", False)),
        "kv_layout": config.get("kv_layout", "NHD"),
    }
    return Call("flashinfer", kwargs, True, requires)


def flex_prefill(config: Mapping[str, Any] | None) -> Call:
    """``flex_attention``'s keyword arguments; none on a miss (Inductor chooses, as untuned)."""
    return Call(None, {}, tuned=False) if config is None else _flex_call(config, None)


DECODE_ATTENTION_DEFAULT = {"num_splits": 1, "gather": "index", "gqa": "expand"}


def decode_attention(config: Mapping[str, Any] | None) -> Call:
    """``split_kv_decode``'s keyword arguments, the task's defaults filled in."""
    if config is None:
        return Call(None, dict(DECODE_ATTENTION_DEFAULT), tuned=False)
    return Call(None, {k: config.get(k, v) for k, v in DECODE_ATTENTION_DEFAULT.items()}, tuned=True)


ADAPTERS: dict[str, Callable[[Mapping[str, Any] | None], Call]] = {
    "flash_decode": flash_decode,
    "flex_prefill": flex_prefill,
    "decode_attention": decode_attention,
}


def call(bundle: _Looks, task: str, /, **params: Any) -> Call:
    """Look ``params`` up in ``bundle`` and adapt the result (a miss gives the default call)."""
    return ADAPTERS[task](bundle.lookup(task, **params))
