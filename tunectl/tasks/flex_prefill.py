"""FlexAttention prefill: a whole prompt attends to itself under a mask, tuned over kernel options.

Inputs are ``q [batch, num_q_heads, seq_len, head_dim]`` and ``k, v [batch, num_kv_heads, seq_len,
head_dim]`` (GQA when the head counts differ). The mask (static ``mask``):

- ``causal``: key <= query;
- ``document_causal``: causal within documents packed into one row; each row holds ``num_docs``
  documents of random lengths (seeded), as sequence packing in serving and training leaves them;
- ``sliding_window``: causal, and the query sees at most ``window[0]`` keys back.

The config is FlexAttention's ``kernel_options`` (BLOCK_M, BLOCK_N, num_warps, num_stages, USE_TMA,
and BACKEND where the installed torch offers it). The default config is empty: Inductor's own choice.
The block mask (128 x 128 blocks) is built once per point and shared by every option set; options
whose tiles do not divide its blocks are invalid. Compiled per static shape (see tunectl.tasks._flex).

A compile process builds each kernel into a package (``build_ahead``: an Inductor standalone artifact) that a
worker loads instead of tracing and compiling (``tunectl.tasks._flex``: on by default;
``TUNECTL_FLEX_AOT=0`` or the task's ``aot`` option turns it off); without one, or where it does not
load, the worker compiles as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from tunectl.core.params import Rule
from tunectl.tasks import _flex
from tunectl.tasks._lazy import lazily
from tunectl.tasks.base import DTYPE_TOLERANCE, InvalidConfig, Params, Task
from tunectl.tasks.compile import key_of, warm_up_libraries

MASKS = ("causal", "document_causal", "sliding_window")
_SPARSE_BLOCK = 128
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
_OPTIONS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "USE_TMA", "BACKEND")
#: imported once per worker on a GPU, before its first item (``warm_up``)
_WARM_MODULES = (
    "torch._inductor.compile_fx",
    "torch.nn.attention.flex_attention",
    "flash_attn.cute.interface",
    "flash_attn.cute.block_sparsity",
)


class FlexPrefill(Task):
    name = "flex_prefill"
    serving_mode = "eager"
    static_params = ("dtype", "head_dim", "mask", "num_docs", "num_kv_heads", "num_q_heads", "window")
    shape_params = ("batch", "seq_len")
    config_params = _OPTIONS
    param_rules: ClassVar[Mapping[str, Rule]] = {
        "dtype": Rule.one_of(*_ITEMSIZE),
        "head_dim": Rule.integer(1, 1024),
        "mask": Rule.one_of(*MASKS),
        "num_docs": Rule.integer(1),
        "num_kv_heads": Rule.integer(1, 1024),
        "num_q_heads": Rule.integer(1, 1024),
        "window": Rule.pair(-1),
        **{n: r for n, r in _flex.KERNEL_OPTION_RULES.items() if n in _OPTIONS},
    }

    def __init__(self, compile_on_cpu: bool = True, aot: bool | None = None) -> None:
        """``aot``: build and load ahead-of-time packages (None: as ``TUNECTL_FLEX_AOT`` says, else on)."""
        self.compile_on_cpu = compile_on_cpu
        self.aot = aot

    def default_config(self, static: Params) -> dict[str, Any]:
        return {}

    def compile_key(self, static: Params, shape: Params, config: Params) -> str:
        """Flex compiles one kernel per static shape and kernel-option set."""
        return key_of(static, shape, config)

    def build_ahead(
        self, static: Params, shape: Params, config: Params, device: str, inputs: dict[str, Any]
    ) -> bool:
        """Build the kernel's package where packages are wanted and a compile cache is set (a whole one
        already there is kept); False where there is none after (``tunectl.tasks.compile.build`` then
        builds the torch.compile kernel into Inductor's caches)."""
        options = self._options(config)

        def made() -> tuple[Any, tuple[Any, ...]]:
            return self._module(static, options), self.aot_args(static, inputs)

        key = self.compile_key(static, shape, config)
        return _flex.build_packaged(
            self.name, static, shape, config, key, device, made, _flex.aot_wanted(self.aot)
        )

    def _module(self, static: Params, options: Mapping[str, Any]) -> Any:
        """The module a package is built from (``_flex.packageable``), which a process without
        packages compiles too (``_flex.compiled_module``)."""
        return _flex.packageable(
            lambda doc_id: make_mask_mod(static, doc_id),
            _SPARSE_BLOCK,
            enable_gqa=static["num_q_heads"] != static["num_kv_heads"],
            options=options,
        )

    def aot_args(self, static: Params, inputs: dict[str, Any]) -> tuple[Any, ...]:
        """What a package's call takes: q, k, v, the document ids, the block mask's tensors."""
        derived = inputs["derived"]
        if "block_mask" not in derived:
            derived["block_mask"] = self._block_mask(static, inputs)
        blocks = _flex.block_tensors(derived["block_mask"])
        return (inputs["q"], inputs["k"], inputs["v"], inputs["doc_id"], blocks)

    def warm_up(self, device: str, configs: Sequence[Mapping[str, Any]] = ()) -> Mapping[str, float]:
        """Import, before the first item, what a first load would: Inductor, Flex, and the flash-attn-4
        modules that ``BACKEND = "FLASH"`` kernels import (an H200 worker's first such load took 4.4 s);
        every config needs them."""
        return warm_up_libraries(_WARM_MODULES) if device.startswith("cuda") else {}

    def check_point(self, static: Params, shape: Params) -> str | None:
        if static["dtype"] not in _ITEMSIZE:
            return f"dtype {static['dtype']!r} is not one of {', '.join(_ITEMSIZE)}"
        if static["mask"] not in MASKS:
            return f"mask {static['mask']!r} is not one of {', '.join(MASKS)}"
        if static["num_q_heads"] % static["num_kv_heads"]:
            return "num_q_heads must be a multiple of num_kv_heads"
        if static["mask"] == "sliding_window" and static["window"][0] < 0:
            return "a sliding_window mask needs window = (left, 0) with left >= 0"
        if static["mask"] != "sliding_window" and tuple(static["window"]) != (-1, -1):
            return f"window applies to sliding_window only, not to {static['mask']}"
        if not 1 <= static["num_docs"] <= shape["seq_len"]:
            return f"num_docs must be between 1 and seq_len={shape['seq_len']}"
        if static["mask"] != "document_causal" and static["num_docs"] != 1:
            return "num_docs applies to document_causal only; set it to 1"
        if static["mask"] == "document_causal" and static["num_docs"] < 2:
            return "document_causal needs num_docs >= 2 (one document is the causal mask)"
        return None

    def build_inputs(self, static: Params, shape: Params, device: str) -> dict[str, Any]:
        import torch

        gen = torch.Generator(device=device).manual_seed(0)
        dtype = getattr(torch, static["dtype"])
        b, s, d = shape["batch"], shape["seq_len"], static["head_dim"]

        def randn(*size: int) -> Any:
            return torch.randn(*size, generator=gen, device=device, dtype=dtype)

        return {
            "q": randn(b, static["num_q_heads"], s, d),
            "k": randn(b, static["num_kv_heads"], s, d),
            "v": randn(b, static["num_kv_heads"], s, d),
            "doc_id": document_ids(b, s, static["num_docs"], device),
            "derived": {},
        }

    def reference(self, static: Params, shape: Params, inputs: dict[str, Any]) -> Any:
        """Float32 attention with the dense mask, one row of the batch at a time."""
        import torch
        import torch.nn.functional as F

        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        group = q.shape[1] // k.shape[1]
        mask_mod = make_mask_mod(static, inputs["doc_id"])
        s = q.shape[2]
        idx = torch.arange(s, device=q.device)
        outs = []
        for b in range(q.shape[0]):
            dense = mask_mod(torch.tensor(b, device=q.device), 0, idx[:, None], idx[None, :])
            kb = k[b].float().repeat_interleave(group, dim=0)
            vb = v[b].float().repeat_interleave(group, dim=0)
            outs.append(F.scaled_dot_product_attention(q[b].float(), kb, vb, attn_mask=dense))
        return torch.stack(outs).to(q.dtype)

    def prepare(
        self, static: Params, shape: Params, config: Params, inputs: dict[str, Any]
    ) -> Callable[[], Any]:
        options = self._options(config)
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        device = str(q.device)
        compiled = device.startswith("cuda") or self.compile_on_cpu
        point = (self.name, static, shape)

        def build() -> Callable[[], Any]:  # on first call: prepare stays off the device
            if _flex.aot_wanted(self.aot):
                key = self.compile_key(static, shape, config)
                call = _flex.packaged(self.name, key, device, point, self.aot_args(static, inputs))
                if call is not None:
                    return call
            if compiled:  # the package's own graph, compiled here
                module = _flex.compiled_module(self._module(static, options), point)
                args = self.aot_args(static, inputs)
                return lambda: module(*args)
            derived = inputs["derived"]
            if "block_mask" not in derived:
                derived["block_mask"] = self._block_mask(static, inputs)
            from torch.nn.attention.flex_attention import flex_attention as flex  # eager

            kwargs: dict[str, Any] = {
                "block_mask": derived["block_mask"],
                "enable_gqa": q.shape[1] != k.shape[1],
            }
            if options:
                kwargs["kernel_options"] = options
            return lambda: flex(q, k, v, **kwargs)

        return lazily(build)

    def _options(self, config: Params) -> dict[str, Any]:
        """The kernel options of ``config``; InvalidConfig where flex cannot take them here."""
        extra = sorted(set(config) - set(_OPTIONS))
        if extra:
            raise InvalidConfig(f"not a FlexAttention kernel option: {', '.join(extra)}")
        options = _flex.kernel_options(config, _OPTIONS)
        _flex.check_block_sizes(options, _SPARSE_BLOCK, _SPARSE_BLOCK)
        return options

    def _block_mask(self, static: Params, inputs: dict[str, Any]) -> Any:
        from torch.nn.attention.flex_attention import create_block_mask

        q = inputs["q"]
        b, s = q.shape[0], q.shape[2]
        return create_block_mask(
            make_mask_mod(static, inputs["doc_id"]),
            b,
            None,
            s,
            s,
            device=str(q.device),
            BLOCK_SIZE=_SPARSE_BLOCK,
        )

    def tolerance(self, static: Params) -> tuple[float, float]:
        return DTYPE_TOLERANCE[static["dtype"]]

    def bytes_moved(self, static: Params, shape: Params) -> int:
        """Q, K, V read once and O written once (prefill is compute-bound; this is the floor)."""
        per_token = (2 * static["num_q_heads"] + 2 * static["num_kv_heads"]) * static["head_dim"]
        return shape["batch"] * shape["seq_len"] * per_token * _ITEMSIZE.get(static["dtype"], 0)


def document_ids(batch: int, seq_len: int, num_docs: int, device: str) -> Any:
    """``[batch, seq_len]`` document index of each token: ``num_docs`` non-empty documents per row."""
    import torch

    gen = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(batch):
        cuts = torch.randperm(seq_len - 1, generator=gen)[: num_docs - 1] + 1
        starts = torch.zeros(seq_len, dtype=torch.int32)
        starts[cuts] = 1
        rows.append(starts.cumsum(0).to(torch.int32))
    return torch.stack(rows).to(device)


def make_mask_mod(static: Params, doc_id: Any) -> Callable[..., Any]:
    kind, left = static["mask"], static["window"][0]
    if kind == "causal":
        return lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
    if kind == "sliding_window":
        return lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx <= left)
    assert kind == "document_causal", kind
    return lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (doc_id[b, q_idx] == doc_id[b, kv_idx])


def attended_pairs(static: Params, shape: Params) -> float:
    """Query-key pairs attended per query head, summed over the batch (for FLOP counts)."""
    s, left = shape["seq_len"], static["window"][0]
    if static["mask"] == "sliding_window":
        w = min(left + 1, s)
        return shape["batch"] * (w * (w + 1) / 2 + (s - w) * w)
    if static["mask"] == "document_causal":
        import torch

        lengths = [
            torch.bincount(row).double() for row in document_ids(shape["batch"], s, static["num_docs"], "cpu")
        ]
        return float(sum((n * (n + 1) / 2).sum() for n in lengths))
    return shape["batch"] * s * (s + 1) / 2


def flops(static: Params, shape: Params) -> float:
    """Forward FLOPs: two matmuls of 2·d per attended pair per query head."""
    return 4.0 * static["head_dim"] * static["num_q_heads"] * attended_pairs(static, shape)
