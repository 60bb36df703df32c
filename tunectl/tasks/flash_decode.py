"""Paged-KV decode attention on real kernels, with the backend as a config dimension.

One point is a batch of ``batch`` sequences, each with ``kv_len`` cached tokens, of which the last
``q_len`` are being decoded (``q_len`` = 1 for plain decode, more for speculative decode). The KV
cache is a pool of pages ``[num_pages, page_size, num_kv_heads, head_dim]``, scattered over the pool
as a serving allocator leaves it, addressed by a page table ``[batch, pages_per_seq]``; queries are
``[batch, q_len, num_q_heads, head_dim]``, outputs the same shape. The page table holds exactly
``ceil(kv_len / page_size)`` pages per sequence and every kernel is told ``kv_len``, so no benchmark
length ever runs past what the inputs were built for.

Static parameters: dtype, head counts, head dim, page size, ``causal``, ``window`` (a pair, ``-1`` =
unbounded), ``softcap`` (0 = off) and ``sinks`` (one learnable sink logit per query head, as in
gpt-oss). Backends and their options (``BACKEND_OPTIONS``):

- ``fa4``: flash-attn-4 ``flash_attn.cute.flash_attn_varlen_func`` with ``page_table``/``seqused_k``;
  ``pack_gqa``, ``num_splits`` (0 = its heuristic; SM90 has no split-KV: splits > 1 are invalid);
- ``fa2``: flash-attn 2 ``flash_attn_with_kvcache``; ``num_splits`` (0 = its heuristic, 1 = no split)
  and ``kv_page_size``: its paged path needs pages of a multiple of 256 tokens, so a config naming
  ``kv_page_size = 256`` runs on a copy of the same cache re-paged into 256-token pages (a serving
  engine choosing it must keep such a cache); without it, a page size it cannot take is invalid;
- ``fa3`` (flash-attn 3, ``flash_attn_interface``) and ``sgl`` (sgl-kernel): ``num_splits``, ``pack_gqa``;
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` over KV gathered from the pages in
  the timed call (SDPA has no paged path); ``sdpa_backend`` (flash, efficient, cudnn, math; absent =
  torch's own dispatch) and ``sdpa_gqa`` (native ``enable_gqa``, or ``expand`` K/V to every head);
- ``flex``: compiled FlexAttention over the page pool itself, with a block mask made from the page
  table (one block per page) and Flex's kernel options;
- ``triton``: this project's split-KV paged decode kernel in Triton (``tunectl.tasks._triton_decode``),
  any page size, GQA rows grouped per KV head; ``num_kv_splits`` (0 = a heuristic), ``BLOCK_N``, ``BLOCK_H``,
  ``num_warps``, ``num_stages``, ``split_rule`` (``tunectl.tasks._adapters_triton``).
- ``flashinfer``: FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper``, planned once and run under CUDA
  graphs as serving runs it (tunectl.tasks._adapters_flashinfer); ``use_tensor_cores``, ``fixed_split_size``
  (pages) and ``disable_split_kv`` (tensor-core path only), ``kv_layout`` (``HND`` runs on a re-laid
  copy of the cache, so like fa2's ``kv_page_size`` it is measured for reference, never chosen).

``default_config`` is flash-attn-4 exactly as its signature leaves it (``num_splits=1``, ``pack_gqa``
chosen by the library): the newest flash-attn, which runs at every page size. ``BACKEND_DEFAULTS``
holds each backend's own untuned call, which specs include so that reports can state the speedup
over every backend's default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from tunectl.core.params import Rule
from tunectl.tasks import _adapters_triton, _flex
from tunectl.tasks._masks import visible
from tunectl.tasks.base import DTYPE_TOLERANCE, InvalidConfig, Params, Task
from tunectl.tasks.compile import key_of, warm_up_libraries

BACKEND_OPTIONS: dict[str, tuple[str, ...]] = {
    "fa4": ("pack_gqa", "num_splits"),
    "fa2": ("num_splits", "kv_page_size"),
    "fa3": ("pack_gqa", "num_splits"),
    "sgl": ("pack_gqa", "num_splits"),
    "sdpa": ("sdpa_backend", "sdpa_gqa"),
    "flex": ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "SPLIT_KV", "USE_TMA", "BACKEND"),
    "triton": _adapters_triton.OPTIONS,
    "flashinfer": ("use_tensor_cores", "fixed_split_size", "disable_split_kv", "kv_layout"),
}
#: each backend called as its library leaves it (fa2: kv_page_size is what lets it run at all).
BACKEND_DEFAULTS: dict[str, dict[str, Any]] = {
    "fa4": {"backend": "fa4"},
    "fa2": {"backend": "fa2", "kv_page_size": 256},
    "fa3": {"backend": "fa3"},
    "sgl": {"backend": "sgl"},
    "sdpa": {"backend": "sdpa"},
    "flex": {"backend": "flex"},
    "triton": {"backend": "triton"},  # its heuristic split count (tunectl.tasks._adapters_triton.DEFAULTS)
    "flashinfer": {"backend": "flashinfer"},
}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
_MAX_KV_BYTES = 8 << 30  # K and V together; larger points are skipped, not half-built
#: per backend, what a worker on a GPU imports before its first item (``warm_up``): only the backends
#: the run measures (flash-attn-4's CUTLASS DSL alone took 5.7-9.8 s on an H200)
_WARM_MODULES = {
    "fa4": ("flash_attn.cute",),
    "fa2": ("flash_attn",),
    "fa3": ("flash_attn_interface",),
    "flex": ("torch._inductor.compile_fx", "torch.nn.attention.flex_attention"),
    "triton": ("tunectl.tasks._triton_decode",),
    "flashinfer": ("flashinfer",),
}


class FlashDecode(Task):
    name = "flash_decode"
    serving_mode = "graph"
    static_params = (
        "causal",
        "dtype",
        "head_dim",
        "num_kv_heads",
        "num_q_heads",
        "page_size",
        "sinks",
        "softcap",
        "window",
    )
    shape_params = ("batch", "kv_len", "q_len")
    split_params = ("num_kv_splits", "num_splits")
    wave_dims = ("batch", "kv_len")
    config_params = ("backend", *tuple(sorted({o for opts in BACKEND_OPTIONS.values() for o in opts})))
    param_rules: ClassVar[Mapping[str, Rule]] = {
        "causal": Rule.one_of(True, False),
        "dtype": Rule.one_of(*_ITEMSIZE),
        "head_dim": Rule.integer(1, 1024),
        "num_kv_heads": Rule.integer(1, 1024),
        "num_q_heads": Rule.integer(1, 1024),
        "page_size": Rule.integer(1, 1 << 16),
        "sinks": Rule.one_of(True, False),
        "softcap": Rule.number(0),
        "window": Rule.pair(-1),
        "backend": Rule.one_of(*BACKEND_OPTIONS),
        "pack_gqa": Rule.one_of(True, False),
        "num_splits": Rule.integer(0, 1024),
        "kv_page_size": Rule.integer(1, 1 << 16),
        "sdpa_backend": Rule.one_of("flash", "efficient", "cudnn", "math"),
        "sdpa_gqa": Rule.one_of("native", "expand"),
        **_flex.KERNEL_OPTION_RULES,
        "num_kv_splits": Rule.integer(0, _adapters_triton.MAX_SPLITS),
        "split_rule": Rule.one_of(*_adapters_triton.SPLIT_RULES),
        "BLOCK_H": Rule.integer(1, 64),
        "use_tensor_cores": Rule.one_of(True, False),
        "fixed_split_size": Rule.integer(1, 1 << 20),
        "disable_split_kv": Rule.one_of(True, False),
        "kv_layout": Rule.one_of("NHD", "HND"),
    }

    def __init__(self, compile_flex_on_cpu: bool = True) -> None:
        # Tests on CPU run Flex eagerly (same masks, block mask and layouts; seconds not minutes).
        self.compile_flex_on_cpu = compile_flex_on_cpu

    def default_config(self, static: Params) -> dict[str, Any]:
        return dict(BACKEND_DEFAULTS["fa4"])

    def selectable(self, static: Params, config: Params) -> bool:
        """A config that runs on a re-paged or re-laid copy of the cache is a reference, not a choice for
        this key: a server would have to keep its cache in that other form."""
        if config.get("kv_layout", "NHD") != "NHD":
            return False
        return config.get("kv_page_size", static["page_size"]) == static["page_size"]

    def compile_key(self, static: Params, shape: Params, config: Params) -> str | None:
        """flash-attn-4 JIT-compiles per static key and config (batch and lengths are dynamic to it,
        except where its split heuristic chooses); FlexAttention compiles per static shape; FlashInfer
        JIT-builds one module per static key and path (tensor cores or not: its other options are plan
        arguments); flash-attn 2/3, sgl-kernel and SDPA ship built."""
        backend = config.get("backend")
        if backend == "flashinfer":
            path = {"backend": backend, "use_tensor_cores": bool(config.get("use_tensor_cores", False))}
            return key_of(static, {"q_len": shape["q_len"]}, path)
        if backend == "fa4" and config.get("num_splits", 1) == 1:
            return key_of(static, {"q_len": shape["q_len"]}, config)
        if backend == "fa4":  # its split heuristic (num_splits 0) picks a kernel per shape
            return key_of(static, shape, config)
        if backend == "flex":
            return key_of(static, shape, config)
        if backend == "triton":
            return _triton_compile_key(static, shape, config)
        return None

    def build_shape(self, static: Params, shape: Params, config: Params) -> dict[str, Any]:
        """flash-attn-4's, FlashInfer's and a fixed-split Triton kernel do not depend on batch or
        length: build them at the smallest point (little memory, a call of a few µs); Flex compiles
        for the item's own shape."""
        if (
            (config.get("backend") == "fa4" and config.get("num_splits", 1) == 1)
            or config.get("backend") == "flashinfer"
            or _triton_any_shape(config)
        ):
            return {**shape, "batch": 1, "kv_len": max(shape["q_len"], static["page_size"])}
        return dict(shape)

    def build_ahead(
        self, static: Params, shape: Params, config: Params, device: str, inputs: dict[str, Any]
    ) -> bool:
        """A Flex config's package where packages are wanted and can be made (``tunectl.tasks._flex``);
        False for every other case (``tunectl.tasks.compile.build`` then calls the kernel once, which
        compiles it into its library's caches)."""
        from tunectl.tasks._adapters_torch import flex_decode_module, flex_decode_options

        if config.get("backend") != "flex" or inputs["sinks"] is not None:
            return False
        flex_decode_options(config, inputs)  # an invalid config is that, not a failed package

        def made() -> tuple[Any, tuple[Any, ...]]:
            return flex_decode_module(static, config, inputs), self.aot_args(static, inputs)

        key = self.compile_key(static, shape, config)
        return _flex.build_packaged(self.name, static, shape, config, key, device, made, _flex.aot_wanted())

    def aot_args(self, static: Params, inputs: dict[str, Any]) -> tuple[Any, ...]:
        """What a Flex decode package's call takes (``_adapters_torch.flex_decode_args``)."""
        from tunectl.tasks._adapters_torch import flex_decode_args

        return flex_decode_args(static, inputs)

    def warm_up(self, device: str, configs: Sequence[Mapping[str, Any]] = ()) -> Mapping[str, float]:
        """Import once per worker, before its first item, the kernel libraries of the backends
        ``configs`` use (all of them where none are given)."""
        if not device.startswith("cuda"):
            return {}
        used = {str(c.get("backend")) for c in configs} if configs else set(_WARM_MODULES)
        return warm_up_libraries(tuple(m for b, mods in _WARM_MODULES.items() if b in used for m in mods))

    def check_point(self, static: Params, shape: Params) -> str | None:
        hq, hkv, d, page = (
            static["num_q_heads"],
            static["num_kv_heads"],
            static["head_dim"],
            static["page_size"],
        )
        if static["dtype"] not in _ITEMSIZE:
            return f"dtype {static['dtype']!r} is not one of {', '.join(_ITEMSIZE)}"
        if min(hq, hkv, d, page) < 1 or hq % hkv:
            return (
                "head counts, head_dim and page_size must be positive, num_q_heads a multiple of num_kv_heads"
            )
        left, right = static["window"]
        if left < -1 or right < -1 or static["softcap"] < 0:
            return "window sides must be >= -1 and softcap >= 0"
        if not 1 <= shape["q_len"] <= shape["kv_len"]:
            return f"q_len={shape['q_len']} must be between 1 and kv_len={shape['kv_len']}"
        kv_bytes = (
            2 * shape["batch"] * _capacity(shape["kv_len"], page) * hkv * d * _ITEMSIZE[static["dtype"]]
        )
        if kv_bytes > _MAX_KV_BYTES:
            return f"the KV cache would take {kv_bytes / 2**30:.1f} GiB (limit {_MAX_KV_BYTES / 2**30:.0f})"
        return None

    def build_inputs(self, static: Params, shape: Params, device: str) -> dict[str, Any]:
        import torch

        gen = torch.Generator(device=device).manual_seed(0)
        dtype = getattr(torch, static["dtype"])
        batch, kv_len, q_len, page = shape["batch"], shape["kv_len"], shape["q_len"], static["page_size"]
        hq, hkv, d = static["num_q_heads"], static["num_kv_heads"], static["head_dim"]
        pages_per_seq = _capacity(kv_len, page) // page
        num_pages = batch * pages_per_seq

        def randn(*size: int) -> Any:
            return torch.randn(*size, generator=gen, device=device, dtype=dtype)

        perm = torch.randperm(num_pages, generator=gen, device=device)
        inputs = {
            "q": randn(batch, q_len, hq, d),
            # Every slot is finite, the tail of a last, partly used page too (kernels may load it).
            "k_cache": randn(num_pages, page, hkv, d),
            "v_cache": randn(num_pages, page, hkv, d),
            "page_table": perm.view(batch, pages_per_seq).to(torch.int32),
            "seqused_k": torch.full((batch,), kv_len, dtype=torch.int32, device=device),
            "sinks": (torch.randn(hq, generator=gen, device=device) + 2.0) if static["sinks"] else None,
            "kv_len": kv_len,
            "q_len": q_len,
            "derived": {},  # per-backend structures made from these inputs, built once on first use
        }
        assert inputs["page_table"].shape[1] * page >= kv_len, "benchmark length exceeds the page table"
        return inputs

    def reference(self, static: Params, shape: Params, inputs: dict[str, Any]) -> Any:
        return reference_decode(static, inputs)

    def prepare(
        self, static: Params, shape: Params, config: Params, inputs: dict[str, Any]
    ) -> Callable[[], Any]:
        backend = config.get("backend")
        if backend not in BACKEND_OPTIONS:
            raise InvalidConfig(f"backend must be one of {', '.join(BACKEND_OPTIONS)}, not {backend!r}")
        extra = sorted(set(config) - {"backend"} - set(BACKEND_OPTIONS[backend]))
        if extra:
            raise InvalidConfig(f"{', '.join(extra)} do(es) not apply to backend {backend}")
        device = str(inputs["q"].device)
        if backend == "sdpa":
            from tunectl.tasks._adapters_torch import sdpa_decode

            return sdpa_decode(static, config, inputs)
        if backend == "flex":
            from tunectl.tasks._adapters_torch import flex_decode

            compiled = device.startswith("cuda") or self.compile_flex_on_cpu
            key = self.compile_key(static, shape, config)
            package = (self.name, key) if compiled and key is not None and _flex.aot_wanted() else None
            return flex_decode(static, config, inputs, (self.name, static, shape), compiled, package)
        if backend == "triton":
            return _adapters_triton.prepare(static, config, inputs)
        if backend == "flashinfer":
            from tunectl.tasks import _adapters_flashinfer

            return _adapters_flashinfer.prepare(static, config, inputs)
        from tunectl.tasks import _adapters_flash

        return _adapters_flash.prepare(backend, static, config, inputs)

    def tolerance(self, static: Params) -> tuple[float, float]:
        return DTYPE_TOLERANCE[static["dtype"]]

    def bytes_moved(self, static: Params, shape: Params) -> int:
        """Bytes a kernel must move: the K/V tokens it may attend to, Q and O, and the page table."""
        itemsize = _ITEMSIZE.get(static["dtype"], 0)
        left = static["window"][0]
        visible = shape["kv_len"] if left < 0 else min(shape["kv_len"], left + shape["q_len"])
        kv = 2 * shape["batch"] * visible * static["num_kv_heads"] * static["head_dim"] * itemsize
        qo = 2 * shape["batch"] * shape["q_len"] * static["num_q_heads"] * static["head_dim"] * itemsize
        table = 4 * shape["batch"] * math.ceil(visible / static["page_size"])
        return kv + qo + table


def _triton_any_shape(config: Params) -> bool:
    """A triton config with a fixed split count builds one kernel for every batch and length."""
    splits = config.get("num_kv_splits", _adapters_triton.DEFAULTS["num_kv_splits"])
    return config.get("backend") == "triton" and splits != 0


def _triton_compile_key(static: Params, shape: Params, config: Params) -> str:
    """Triton compiles per static key, q_len and options; the heuristic split count (0) decides per
    shape whether the merge pass runs, so it is built per shape."""
    if _triton_any_shape(config):
        return key_of(static, {"q_len": shape["q_len"]}, config)
    return key_of(static, shape, config)


def _capacity(kv_len: int, page_size: int) -> int:
    """Tokens the page table holds per sequence: whole pages, at least kv_len."""
    return math.ceil(kv_len / page_size) * page_size


def reference_decode(static: Params, inputs: dict[str, Any]) -> Any:
    """Plain attention in float32, a few sequences at a time, with softcap and sinks as defined above."""
    import torch

    q, kc, vc, table = inputs["q"], inputs["k_cache"], inputs["v_cache"], inputs["page_table"]
    kv_len, q_len = inputs["kv_len"], inputs["q_len"]
    batch, _, hq, d = q.shape
    hkv = kc.shape[2]
    group = hq // hkv
    ok = visible(static, kv_len, q_len, q.device)
    chunk = max(1, (256 << 20) // (kv_len * max(hkv * d, hq * q_len) * 4))
    softcap = float(static["softcap"])
    outs = []
    for b0 in range(0, batch, chunk):
        rows = table[b0 : b0 + chunk].long()
        k = kc[rows].flatten(1, 2)[:, :kv_len].float()  # [c, kv_len, hkv, d]
        v = vc[rows].flatten(1, 2)[:, :kv_len].float()
        qs = q[b0 : b0 + chunk].float().view(-1, q_len, hkv, group, d)
        s = torch.einsum("blhgd,bthd->bhglt", qs, k) / math.sqrt(d)
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(~ok, float("-inf"))
        top = s.amax(-1, keepdim=True)
        if inputs["sinks"] is not None:
            sink = inputs["sinks"].float().view(1, hkv, group, 1, 1)
            top = torch.maximum(top, sink)
        p = torch.exp(s - top)
        denom = p.sum(-1, keepdim=True)
        if inputs["sinks"] is not None:
            denom = denom + torch.exp(sink - top)
        out = torch.einsum("bhglt,bthd->blhgd", p / denom, v)
        outs.append(out.reshape(-1, q_len, hq, d))
    return torch.cat(outs).to(q.dtype)
