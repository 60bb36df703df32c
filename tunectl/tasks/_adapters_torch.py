"""Decode adapters built on torch itself: SDPA over gathered pages, and FlexAttention over the page pool.

SDPA has no paged path: the timed call gathers each sequence's pages into ``[batch, heads, kv_len,
dim]`` and then attends, which is what running SDPA over a paged cache costs.

Flex attends over the pool in place: K and V are viewed as one sequence ``[1, kv_heads, num_pages *
page_size, dim]`` shared by the whole batch, and a block mask with one KV block per page lists, for
each sequence, the physical pages it owns (its page-table row). Pages every query sees in full are
"full" blocks (no mask evaluated); the rest (a partly used last page, window edges) are masked by a
mask_mod that maps a physical slot back to (sequence, position) through per-page tables. The
mask_mod alone defines the semantics; the block lists only skip work.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tunectl.tasks import _flex
from tunectl.tasks._lazy import lazily
from tunectl.tasks._masks import visible
from tunectl.tasks.base import InvalidConfig, Params

#: sdpa_backend values, and the SDPBackend member each forces
_SDPA_BACKEND_MEMBERS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}
SDPA_BACKENDS = tuple(_SDPA_BACKEND_MEMBERS)
_FLEX_Q_BLOCK = 128


def sdpa_decode(static: Params, config: Params, inputs: dict[str, Any]) -> Callable[[], Any]:
    import torch.nn.functional as F

    backend, gqa = _sdpa_options(static, config, inputs)
    q, kc, vc, table = inputs["q"], inputs["k_cache"], inputs["v_cache"], inputs["page_table"].long()
    kv_len, q_len = inputs["kv_len"], inputs["q_len"]
    group = q.shape[2] // kc.shape[2]
    mask = _sdpa_mask(static, kv_len, q_len, q.device)
    qt = q.transpose(1, 2)  # [batch, hq, q_len, d]

    def gather(cache: Any) -> Any:
        kv = cache[table].flatten(1, 2)[:, :kv_len].transpose(1, 2)  # [batch, hkv, kv_len, d]
        return kv.repeat_interleave(group, dim=1) if gqa == "expand" and group > 1 else kv

    def attend() -> Any:
        out = F.scaled_dot_product_attention(
            qt, gather(kc), gather(vc), attn_mask=mask, enable_gqa=gqa == "native" and group > 1
        )
        return out.transpose(1, 2)

    return attend if backend is None else _forced(attend, backend)


def _sdpa_options(static: Params, config: Params, inputs: dict[str, Any]) -> tuple[str | None, str]:
    """(sdpa_backend or None for SDPA's own choice, sdpa_gqa); InvalidConfig where SDPA cannot run."""
    if inputs["sinks"] is not None or static["softcap"] > 0:
        raise InvalidConfig("SDPA has no attention sinks and no softcap")
    backend, gqa = config.get("sdpa_backend"), config.get("sdpa_gqa", "native")
    if backend is not None and backend not in SDPA_BACKENDS:
        raise InvalidConfig(f"sdpa_backend must be one of {', '.join(SDPA_BACKENDS)}, not {backend!r}")
    if gqa not in ("native", "expand"):
        raise InvalidConfig(f"sdpa_gqa must be native or expand, not {gqa!r}")
    return backend, gqa


def _forced(attend: Callable[[], Any], backend: str) -> Callable[[], Any]:
    """``attend`` run with SDPA held to ``backend``; a point that backend refuses is invalid, not an error."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = getattr(SDPBackend, _SDPA_BACKEND_MEMBERS[backend])

    def call() -> Any:
        with sdpa_kernel([chosen]):
            return attend()

    def reject(exc: Exception) -> str | None:
        text = str(exc)
        if isinstance(exc, RuntimeError) and ("No available kernel" in text or "No viable backend" in text):
            return f"SDPA {backend} does not take this point: {text[:300]}"
        return None

    return lazily(lambda: call, reject)


def _sdpa_mask(static: Params, kv_len: int, q_len: int, device: Any) -> Any:
    """None where no key is masked (decode of one token, no window); else what SDPA needs."""
    left, right = static["window"]
    if left < 0 and (q_len == 1 or (not static["causal"] and right < 0)):
        return None
    if left < 0 and static["causal"]:
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(q_len, kv_len)
    return visible(static, kv_len, q_len, device)


def flex_decode(
    static: Params,
    config: Params,
    inputs: dict[str, Any],
    point: object,
    compiled: bool,
    package: tuple[str, str] | None = None,
) -> Callable[[], Any]:
    """The Flex call over the page pool; ``package``: (task, compile key) of a package to load instead
    of tracing (``tunectl.tasks._flex``), where a compile process built one."""
    if inputs["sinks"] is not None:
        raise InvalidConfig("FlexAttention has no attention sinks")
    options = flex_decode_options(config, inputs)
    device = str(inputs["q"].device)

    def build() -> Callable[[], Any]:
        args = flex_decode_args(static, inputs)
        if package is not None:
            call = _flex.packaged(*package, device, point, args)
            if call is not None:
                return call
        if compiled:  # the package's own graph, compiled here (``_flex.compiled_module``)
            module = _flex.compiled_module(flex_decode_module(static, config, inputs), point)
            return lambda: module(*args)
        block_mask, score_mod = _point_flex(static, inputs)
        from torch.nn.attention.flex_attention import flex_attention as flex  # eager

        q, k, v = pool_views(inputs)
        kwargs: dict[str, Any] = {"block_mask": block_mask, "enable_gqa": q.shape[1] != k.shape[1]}
        if score_mod is not None:
            kwargs["score_mod"] = score_mod
        if options:
            kwargs["kernel_options"] = options
        return lambda: flex(q, k, v, **kwargs).transpose(1, 2)

    return lazily(build)


def flex_decode_options(config: Params, inputs: dict[str, Any]) -> dict[str, Any]:
    """The kernel options of a Flex decode config; InvalidConfig where flex cannot take them here."""
    options = _flex.kernel_options(config, tuple(_flex.KERNEL_OPTIONS))
    _flex.check_block_sizes(options, _FLEX_Q_BLOCK, inputs["k_cache"].shape[1])
    return options


def pool_views(inputs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """q as ``[batch, hq, q_len, d]``, and K and V as one sequence of the whole pool
    ``[1, hkv, num_pages * page, d]`` (views: nothing is copied)."""
    kc, vc = inputs["k_cache"], inputs["v_cache"]
    num_pages, page, hkv, d = kc.shape
    return (
        inputs["q"].transpose(1, 2),
        kc.view(1, num_pages * page, hkv, d).transpose(1, 2),
        vc.view(1, num_pages * page, hkv, d).transpose(1, 2),
    )


def flex_decode_args(static: Params, inputs: dict[str, Any]) -> tuple[Any, ...]:
    """What a Flex decode package's call takes (``flex_decode_module``): q, the K and V caches, the
    pool's page maps and the block mask's tensors, each made once per point."""
    return (
        inputs["q"],
        inputs["k_cache"],
        inputs["v_cache"],
        _page_maps(inputs),
        _flex.block_tensors(_point_flex(static, inputs)[0]),
    )


def _point_flex(static: Params, inputs: dict[str, Any]) -> tuple[Any, Any]:
    """The point's block mask and score function: made once per point, shared by every option set."""
    derived = inputs["derived"]
    if "flex" not in derived:
        derived["flex"] = (paged_block_mask(static, inputs), _softcap_mod(float(static["softcap"])))
    parts: tuple[Any, Any] = derived["flex"]
    return parts


def flex_decode_module(static: Params, config: Params, inputs: dict[str, Any]) -> Any:
    """A module whose ``forward(*flex_decode_args(...))`` is the Flex decode call of ``config`` at the
    inputs' point (the pool's views around ``_flex.packageable``'s call, with the paged mask and the
    score function): what a package is built from. The point's sizes (page, lengths) are part of the
    kernel, as its compile key says."""
    import torch

    page, kv_len, q_len = inputs["k_cache"].shape[1], inputs["kv_len"], inputs["q_len"]
    call = _flex.packageable(
        lambda maps: _paged_mask_mod(static, maps, page=page, kv_len=kv_len, q_len=q_len),
        (_FLEX_Q_BLOCK, page),
        enable_gqa=static["num_q_heads"] != static["num_kv_heads"],
        options=flex_decode_options(config, inputs),
        score_mod=_softcap_mod(float(static["softcap"])),
    )

    class FlexDecodeCall(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.call = call

        def forward(self, q: Any, kc: Any, vc: Any, maps: tuple[Any, Any], blocks: tuple[Any, ...]) -> Any:
            q4, k, v = pool_views({"q": q, "k_cache": kc, "v_cache": vc})
            return self.call(q4, k, v, maps, blocks).transpose(1, 2)

    return FlexDecodeCall()


def _softcap_mod(softcap: float) -> Any:
    if softcap <= 0:
        return None
    import torch

    def softcap_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return softcap * torch.tanh(score / softcap)

    return softcap_mod


def page_ranges(static: Params, kv_len: int, q_len: int, page: int) -> tuple[list[int], list[int]]:
    """(partial, full) logical page indices: pages some query sees in part, and pages all see in full."""
    left, right = static["window"]
    right_eff = 0 if static["causal"] else (right if right >= 0 else kv_len)
    first_pos, last_pos = kv_len - q_len, kv_len - 1
    lo_any = max(0, first_pos - left) if left >= 0 else 0  # the lowest key any query sees
    hi_any = min(kv_len - 1, last_pos + right_eff)
    lo_all = max(0, last_pos - left) if left >= 0 else 0  # keys every query sees
    hi_all = min(kv_len - 1, first_pos + right_eff)
    partial: list[int] = []
    full: list[int] = []
    for p in range(lo_any // page, hi_any // page + 1):
        first, last = p * page, p * page + page - 1
        (full if lo_all <= first and last <= hi_all else partial).append(p)
    return partial, full


def paged_block_mask(static: Params, inputs: dict[str, Any]) -> Any:
    """A BlockMask over the page pool: one KV block per page, one row of blocks per sequence."""
    from torch.nn.attention.flex_attention import BlockMask

    kc, table = inputs["k_cache"], inputs["page_table"]
    kv_len, q_len = inputs["kv_len"], inputs["q_len"]
    num_pages, page = kc.shape[0], kc.shape[1]
    partial, full = page_ranges(static, kv_len, q_len, page)
    num_q_blocks = math.ceil(q_len / _FLEX_Q_BLOCK)
    kv_num, kv_idx = _page_blocks(table, partial, num_q_blocks, num_pages)
    full_num, full_idx = _page_blocks(table, full, num_q_blocks, num_pages)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=(_FLEX_Q_BLOCK, page),
        mask_mod=_paged_mask_mod(static, _page_maps(inputs), page=page, kv_len=kv_len, q_len=q_len),
        seq_lengths=(q_len, num_pages * page),
    )


def _page_maps(inputs: dict[str, Any]) -> tuple[Any, Any]:
    """(owner, logical) per physical page of the pool: the sequence that owns it and its index in that
    sequence's pages (made once per point)."""
    derived = inputs["derived"]
    if "page_maps" not in derived:
        import torch

        table, num_pages = inputs["page_table"], inputs["k_cache"].shape[0]
        batch, pages_per_seq = table.shape
        device = table.device
        owner = torch.arange(batch, device=device, dtype=torch.int32).repeat_interleave(pages_per_seq)
        logical = torch.arange(pages_per_seq, device=device, dtype=torch.int32).repeat(batch)
        page_owner = torch.empty(num_pages, dtype=torch.int32, device=device)
        page_logical = torch.empty(num_pages, dtype=torch.int32, device=device)
        flat = table.flatten().long()
        page_owner[flat], page_logical[flat] = owner, logical
        derived["page_maps"] = (page_owner, page_logical)
    maps: tuple[Any, Any] = derived["page_maps"]
    return maps


def _paged_mask_mod(static: Params, maps: tuple[Any, Any], *, page: int, kv_len: int, q_len: int) -> Any:
    """The mask_mod over the pool: a physical slot maps back to (its sequence, its position) through
    the per-page ``maps`` of owner and logical page (``_page_maps``), then the causal and window rules
    apply."""
    page_owner, page_logical = maps
    left, right = static["window"]
    causal = bool(static["causal"])
    offset = kv_len - q_len

    def paged_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        slot = kv_idx // page
        pos = page_logical[slot] * page + kv_idx % page
        query_pos = q_idx + offset
        ok = (page_owner[slot] == b) & (pos < kv_len)
        if causal:
            ok = ok & (pos <= query_pos)
        elif right >= 0:
            ok = ok & (pos <= query_pos + right)
        if left >= 0:
            ok = ok & (pos >= query_pos - left)
        return ok

    return paged_mask


def _page_blocks(table: Any, pages: list[int], num_q_blocks: int, num_pages: int) -> tuple[Any, Any]:
    """(counts, indices) of KV blocks for ``pages`` (logical page indices) of every sequence."""
    import torch

    batch, device = table.shape[0], table.device
    # BlockMask wants one column per KV block of the pool; those past the count are unused.
    indices = torch.zeros(batch, 1, num_q_blocks, num_pages, dtype=torch.int32, device=device)
    if pages:
        cols = torch.tensor(pages, dtype=torch.long, device=device)
        indices[..., : len(pages)] = table[:, cols].view(batch, 1, 1, -1)
    counts = torch.full((batch, 1, num_q_blocks), len(pages), dtype=torch.int32, device=device)
    return counts, indices
