"""FlashInfer's paged decode for the decode task: ``flashinfer.BatchDecodeWithPagedKVCacheWrapper``.

Written against FlashInfer 0.7.2.post1. The wrapper is driven as a serving engine drives it under
CUDA graphs: made once per config with ``use_cuda_graph=True`` and fixed page-metadata buffers sized
for the batch, a 128 MB float workspace (FlashInfer's recommended size), planned once with
``plan()`` (page metadata, split plan, JIT build of its module) and then called through ``run()``
alone, which is what the harness captures and times.

A config maps onto the wrapper as follows (absent options: the library's own defaults):

- ``use_tensor_cores`` (constructor, default False): the tensor-core (prefill-kernel) path or the
  CUDA-core decode kernel; they are separate JIT modules.
- ``fixed_split_size`` (``plan``, in pages; absent = the planner's own split): tensor-core path only.
- ``disable_split_kv`` (``plan``): tensor-core path only; the CUDA-core planner ignores it, so there
  it would time the default under another name and is refused.
- ``kv_layout`` (constructor): ``NHD`` is the task's cache ``[num_pages, page_size, num_kv_heads,
  head_dim]`` as it is; ``HND`` runs on a copy re-laid as ``[num_pages, num_kv_heads, page_size,
  head_dim]``, made once per point (a reference config: ``FlashDecode.selectable``).

The static key maps as: ``window[0]`` -> ``window_left`` (-1 unbounded), ``softcap`` ->
``logits_soft_cap`` (0 off). The decode wrapper takes one query token per sequence (``q_len`` > 1 is
invalid; with one query token ``causal`` and the right window bound change nothing) and has no
attention sinks on its decode kernels.

The mapping (``check``, ``page_metadata``, ``wrapper_kwargs``, ``plan_kwargs``) is pure and runs
on CPU without FlashInfer; ``prepare`` imports FlashInfer and defers every device step to the first
call (``tunectl.tasks._lazy``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tunectl.tasks._lazy import lazily
from tunectl.tasks.base import InvalidConfig, Params

WORKSPACE_BYTES = 128 << 20
LAYOUTS = ("NHD", "HND")
_HALF = ("float16", "bfloat16")


def check(static: Params, config: Params, *, q_len: int, has_sinks: bool) -> None:
    """Raise ``InvalidConfig`` (one line) for a config or point this wrapper cannot run as asked."""
    if static["dtype"] not in _HALF:
        raise InvalidConfig(f"flashinfer decode takes float16 or bfloat16, not {static['dtype']}")
    if q_len != 1:
        raise InvalidConfig(f"flashinfer's decode wrapper takes one query token per sequence, not {q_len}")
    if has_sinks:
        raise InvalidConfig("flashinfer's decode kernels have no attention sinks")
    tensor_cores = config.get("use_tensor_cores", False)
    if not isinstance(tensor_cores, bool):
        raise InvalidConfig(f"use_tensor_cores must be true or false, not {tensor_cores!r}")
    split = config.get("fixed_split_size")
    if split is not None and (not isinstance(split, int) or isinstance(split, bool) or split < 1):
        raise InvalidConfig(f"fixed_split_size must be a number of pages >= 1, not {split!r}")
    disable = config.get("disable_split_kv", False)
    if not isinstance(disable, bool):
        raise InvalidConfig(f"disable_split_kv must be true or false, not {disable!r}")
    if not tensor_cores and (split is not None or disable):
        option = "fixed_split_size" if split is not None else "disable_split_kv"
        raise InvalidConfig(f"{option} applies to flashinfer's tensor-core path only (use_tensor_cores)")
    if split is not None and disable:
        raise InvalidConfig("fixed_split_size and disable_split_kv exclude each other")
    if config.get("kv_layout", "NHD") not in LAYOUTS:
        raise InvalidConfig(f"kv_layout must be one of {', '.join(LAYOUTS)}, not {config.get('kv_layout')!r}")


def page_metadata(page_table: Any, kv_len: int, page_size: int) -> tuple[Any, Any, Any]:
    """FlashInfer's CSR page metadata for ``batch`` sequences of ``kv_len`` tokens, all int32 on the
    page table's device: ``indptr [batch + 1]`` (each sequence's first entry in ``indices``),
    ``indices`` (the page table's used pages, row after row) and ``last_page_len [batch]`` (tokens
    in each sequence's last page, 1..page_size)."""
    import torch

    batch = page_table.shape[0]
    pages = math.ceil(kv_len / page_size)
    device = page_table.device
    indptr = torch.arange(batch + 1, dtype=torch.int32, device=device) * pages
    indices = page_table[:, :pages].reshape(-1).to(torch.int32)
    last = kv_len - (pages - 1) * page_size
    last_page_len = torch.full((batch,), last, dtype=torch.int32, device=device)
    return indptr, indices, last_page_len


def wrapper_kwargs(
    config: Params, *, workspace: Any, indptr: Any, indices: Any, last_page_len: Any
) -> dict[str, Any]:
    """The constructor's arguments: CUDA-graph mode, with the metadata buffers the graph reads.

    The buffers are allocated here with the plan's sizes (``plan()`` copies into them); a graph
    replays against these addresses, as serving's captured decode step does."""
    return {
        "float_workspace_buffer": workspace,
        "kv_layout": config.get("kv_layout", "NHD"),
        "use_cuda_graph": True,
        "use_tensor_cores": bool(config.get("use_tensor_cores", False)),
        "paged_kv_indptr_buffer": indptr.new_empty(indptr.shape),
        "paged_kv_indices_buffer": indices.new_empty(indices.shape),
        "paged_kv_last_page_len_buffer": last_page_len.new_empty(last_page_len.shape),
    }


def plan_kwargs(
    static: Params, config: Params, *, indptr: Any, indices: Any, last_page_len: Any
) -> dict[str, Any]:
    """``plan()``'s arguments, every one by keyword (0.7 deprecates positional options)."""
    import torch

    dtype = getattr(torch, static["dtype"])
    kwargs: dict[str, Any] = {
        "indptr": indptr,
        "indices": indices,
        "last_page_len": last_page_len,
        "num_qo_heads": int(static["num_q_heads"]),
        "num_kv_heads": int(static["num_kv_heads"]),
        "head_dim": int(static["head_dim"]),
        "page_size": int(static["page_size"]),
        "window_left": int(static["window"][0]) if static["window"][0] >= 0 else -1,
        "logits_soft_cap": float(static["softcap"]),
        "q_data_type": dtype,
        "kv_data_type": dtype,
    }
    if config.get("fixed_split_size") is not None:
        kwargs["fixed_split_size"] = int(config["fixed_split_size"])
    if config.get("disable_split_kv"):
        kwargs["disable_split_kv"] = True
    return kwargs


def kv_cache(inputs: dict[str, Any], layout: str) -> tuple[Any, Any]:
    """(K, V) in ``layout``: the task's own cache for NHD; for HND a re-laid copy, made once per point."""
    if layout == "NHD":
        return inputs["k_cache"], inputs["v_cache"]
    derived = inputs["derived"]
    if ("flashinfer", "HND") not in derived:
        derived[("flashinfer", "HND")] = tuple(
            inputs[name].transpose(1, 2).contiguous() for name in ("k_cache", "v_cache")
        )
    return derived[("flashinfer", "HND")]  # type: ignore[no-any-return]


def workspace(inputs: dict[str, Any]) -> Any:
    """The point's float workspace, zeroed once and shared by its configs' wrappers, as a server shares
    one across its layers: calls run one after another on one stream, each rewriting what it uses."""
    derived = inputs["derived"]
    if ("flashinfer", "workspace") not in derived:
        import torch

        device = inputs["q"].device
        derived[("flashinfer", "workspace")] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return derived[("flashinfer", "workspace")]


def prepare(static: Params, config: Params, inputs: dict[str, Any]) -> Callable[[], Any]:
    """Check the config, import FlashInfer, and return the call; plan and build happen on the first call."""
    check(static, config, q_len=inputs["q_len"], has_sinks=inputs["sinks"] is not None)
    if inputs["q"].device.type != "cuda":
        raise InvalidConfig("flashinfer runs on CUDA devices only")
    from flashinfer import BatchDecodeWithPagedKVCacheWrapper

    def build() -> Callable[[], Any]:
        meta = page_metadata(inputs["page_table"], inputs["kv_len"], int(static["page_size"]))
        names = ("indptr", "indices", "last_page_len")
        arrays = dict(zip(names, meta, strict=True))
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            **wrapper_kwargs(config, workspace=workspace(inputs), **arrays)
        )
        wrapper.plan(**plan_kwargs(static, config, **arrays))  # once, outside any graph, as serving does
        q4 = inputs["q"]
        q = q4.view(q4.shape[0], q4.shape[2], q4.shape[3])  # [batch, heads, dim]: one token each
        k, v = kv_cache(inputs, config.get("kv_layout", "NHD"))
        out = q.new_empty(q.shape)

        def call() -> Any:
            wrapper.run(q, (k, v), out=out)
            return out.view(q4.shape)

        return call

    return lazily(build, rejection)


def rejection(exc: Exception) -> str | None:
    """Why FlashInfer refused this config at this point, where the error says so; else None (an error).

    It states what it does not support as ``NotImplementedError``. In CUDA-graph mode its planner
    also refuses a ``fixed_split_size`` that cuts the batch into more work units than the graph's
    fixed grid holds (seen on an H200 at 4 x 4096 tokens in pages of 16 with 8-page splits)."""
    if isinstance(exc, NotImplementedError):
        return f"flashinfer rejects this point: {exc}"
    if isinstance(exc, RuntimeError) and "PrefillSplitQOKVIndptr" in str(exc):
        return (
            "flashinfer's CUDA-graph plan cannot cut this batch into splits of fixed_split_size pages "
            f"(more work units than its fixed grid holds): {str(exc).splitlines()[0]}"
        )
    return None
