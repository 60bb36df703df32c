"""flash-attn family decode adapters: the arguments each library's paged decode call takes.

Each ``*_kwargs`` function maps the decode task's inputs, static parameters and config onto one
library function's keyword arguments, by the names that function declares:

- fa4: ``flash_attn.cute.flash_attn_varlen_func`` (flash-attn-4): ``page_table``, ``seqused_k``,
  ``window_size`` with None for an unbounded side, ``learnable_sink``, ``num_splits`` (default 1),
  ``pack_gqa`` (default None: the library decides);
- fa2: ``flash_attn.flash_attn_with_kvcache`` (2.8): ``block_table`` (blocks of a multiple of 256
  tokens), ``cache_seqlens``, ``window_size`` with -1, ``num_splits`` (default 0, its heuristic); no sinks;
- fa3: ``flash_attn_interface.flash_attn_with_kvcache`` (flash-attn 3, hopper/): ``page_table`` of any
  page size, ``cache_seqlens``, ``num_splits`` (default 0), ``pack_gqa``; no sinks;
- sgl: ``sgl_kernel.flash_attn.flash_attn_with_kvcache`` (sgl-kernel's FA3 build): as fa3, plus ``sinks``.

The mapping is pure (no kernel library needed), so it is tested on CPU against the documented
signatures; ``prepare`` checks the config and imports the library; the kernel is built (compiled,
the cache re-paged) on the first call (tunectl.tasks._lazy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tunectl.tasks._lazy import lazily
from tunectl.tasks.base import InvalidConfig, Params

_HALF = ("float16", "bfloat16")


def _common(static: Params, inputs: dict[str, Any], unbounded: int | None) -> dict[str, Any]:
    left, right = static["window"]
    return {
        "q": inputs["q"],
        "causal": bool(static["causal"]),
        "window_size": (left if left >= 0 else unbounded, right if right >= 0 else unbounded),
        "softcap": float(static["softcap"]),
    }


def fa4_kwargs(static: Params, config: Params, inputs: dict[str, Any]) -> dict[str, Any]:
    kwargs = _common(static, inputs, unbounded=None)
    kwargs.update(
        k=inputs["k_cache"],
        v=inputs["v_cache"],
        page_table=inputs["page_table"],
        seqused_k=inputs["seqused_k"],
        learnable_sink=inputs["sinks"],
        num_splits=int(config.get("num_splits", 1)),
        pack_gqa=config.get("pack_gqa"),
    )
    return kwargs


def fa2_kwargs(static: Params, config: Params, inputs: dict[str, Any]) -> dict[str, Any]:
    if inputs["sinks"] is not None:
        raise InvalidConfig("flash-attn 2 has no attention sinks")
    k_cache, v_cache, table = repaged(inputs, fa2_page_size(config, inputs))
    kwargs = _common(static, inputs, unbounded=-1)
    kwargs.update(
        k_cache=k_cache,
        v_cache=v_cache,
        block_table=table,
        cache_seqlens=inputs["seqused_k"],
        num_splits=int(config.get("num_splits", 0)),
    )
    return kwargs


def fa2_page_size(config: Params, inputs: dict[str, Any]) -> int:
    """The page size flash-attn 2 runs with; InvalidConfig where its paged path cannot take it."""
    page = config.get("kv_page_size", inputs["k_cache"].shape[1])
    if not isinstance(page, int) or isinstance(page, bool) or page < 1 or page % 256:
        raise InvalidConfig(
            f"flash-attn 2's paged KV needs pages of a multiple of 256 tokens, not {page}; "
            "set kv_page_size = 256 to run it on a re-paged copy of the cache"
        )
    return page


def fa3_kwargs(static: Params, config: Params, inputs: dict[str, Any]) -> dict[str, Any]:
    if inputs["sinks"] is not None:
        raise InvalidConfig("flash-attn 3 (hopper/) has no attention sinks")
    kwargs = sgl_kwargs(static, config, inputs)
    del kwargs["sinks"]
    return kwargs


def sgl_kwargs(static: Params, config: Params, inputs: dict[str, Any]) -> dict[str, Any]:
    """sgl-kernel's decode takes flash-attn 3's arguments, and attention sinks besides."""
    kwargs = _common(static, inputs, unbounded=-1)
    kwargs.update(
        k_cache=inputs["k_cache"],
        v_cache=inputs["v_cache"],
        page_table=inputs["page_table"],
        cache_seqlens=inputs["seqused_k"],
        num_splits=int(config.get("num_splits", 0)),
        pack_gqa=config.get("pack_gqa"),
        sinks=inputs["sinks"],
    )
    return kwargs


KWARGS: dict[str, Callable[[Params, Params, dict[str, Any]], dict[str, Any]]] = {
    "fa4": fa4_kwargs,
    "fa2": fa2_kwargs,
    "fa3": fa3_kwargs,
    "sgl": sgl_kwargs,
}


def library_function(backend: str) -> Callable[..., Any]:
    """The library call for ``backend``; ImportError where that library is not installed."""
    if backend == "fa4":
        from flash_attn.cute import flash_attn_varlen_func

        return flash_attn_varlen_func  # type: ignore[no-any-return]
    if backend == "fa2":
        from flash_attn import flash_attn_with_kvcache

        return flash_attn_with_kvcache  # type: ignore[no-any-return]
    if backend == "fa3":
        from flash_attn_interface import flash_attn_with_kvcache as fa3_with_kvcache

        return fa3_with_kvcache  # type: ignore[no-any-return]
    if backend == "sgl":
        from sgl_kernel.flash_attn import flash_attn_with_kvcache as sgl_with_kvcache

        return sgl_with_kvcache  # type: ignore[no-any-return]
    raise ValueError(f"not a flash-attn backend: {backend!r}")


def prepare(backend: str, static: Params, config: Params, inputs: dict[str, Any]) -> Callable[[], Any]:
    """Check the config against what the kernel takes here, then return the call (run once)."""
    q = inputs["q"]
    if q.device.type != "cuda":
        raise InvalidConfig(f"{backend} runs on CUDA devices only")
    if static["dtype"] not in _HALF:
        raise InvalidConfig(f"{backend} takes float16 or bfloat16, not {static['dtype']}")
    pack_gqa = config.get("pack_gqa")
    if pack_gqa is not None and not isinstance(pack_gqa, bool):
        raise InvalidConfig(f"pack_gqa must be true or false, not {pack_gqa!r}")
    num_splits = config.get("num_splits", 0)
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 0:
        raise InvalidConfig(f"num_splits must be an integer >= 0, not {num_splits!r}")
    import torch

    if backend == "fa4" and torch.cuda.get_device_capability(q.device)[0] == 9 and num_splits > 1:
        raise InvalidConfig("flash-attn-4 has no split-KV on SM90 (num_splits > 1)")
    if backend == "fa2":
        fa2_page_size(config, inputs)
    if backend in ("fa2", "fa3") and inputs["sinks"] is not None:
        raise InvalidConfig(f"{backend} has no attention sinks")
    fn = library_function(backend)

    def build() -> Callable[[], Any]:
        kwargs = KWARGS[backend](static, config, inputs)  # fa2: re-pages the cache, once per point

        def call() -> Any:
            out = fn(**kwargs)
            return out[0] if isinstance(out, tuple) else out

        return call

    def reject(exc: Exception) -> str | None:
        # flash-attn-4 states what it does not support as assertions (first call: ~2.5 s compile)
        return f"{backend} rejects this point: {exc}" if isinstance(exc, AssertionError) else None

    return lazily(build, reject)


def repaged(inputs: dict[str, Any], page: int) -> tuple[Any, Any, Any]:
    """The cache in pages of ``page`` tokens (the same tokens, pages scattered), made once per point."""
    k_cache, v_cache, table = inputs["k_cache"], inputs["v_cache"], inputs["page_table"]
    if page == k_cache.shape[1]:
        return k_cache, v_cache, table
    derived = inputs["derived"]
    if ("repaged", page) not in derived:
        import torch

        batch, kv_len = table.shape[0], inputs["kv_len"]
        per_seq = -(-kv_len // page)
        gen = torch.Generator(device=k_cache.device).manual_seed(1)
        perm = torch.randperm(batch * per_seq, generator=gen, device=k_cache.device)
        new_table = perm.view(batch, per_seq).to(torch.int32)

        def move(cache: Any) -> Any:
            tokens = cache[table.long()].flatten(1, 2)[:, :kv_len]  # [batch, kv_len, heads, dim]
            pooled = cache.new_zeros(batch * per_seq, page, *cache.shape[2:])
            padded = cache.new_zeros(batch, per_seq * page, *cache.shape[2:])
            padded[:, :kv_len] = tokens
            pooled[new_table.long().flatten()] = padded.view(batch * per_seq, page, *cache.shape[2:])
            return pooled

        derived[("repaged", page)] = (move(k_cache), move(v_cache), new_table)
    return derived[("repaged", page)]  # type: ignore[no-any-return]
