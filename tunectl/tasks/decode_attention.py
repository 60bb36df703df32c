"""Paged-KV split-KV decode attention in plain torch (CPU, or any torch device).

Queries ``[batch, num_q_heads, head_dim]`` attend to a KV cache stored in pages of ``page_size``
tokens, ``[num_pages, page_size, num_kv_heads, head_dim]``, addressed by a page table
``[batch, max_pages]``. Query heads are grouped over KV heads (GQA).

Configs change the work really done:
- ``num_splits``: the KV sequence is cut into this many chunks, each reduced to a partial output and
  its log-sum-exp, then combined (flash-decoding). More splits: smaller intermediates, more passes.
- ``gather``: ``index`` gathers a chunk's pages for the whole batch with one advanced index;
  ``per_seq`` gathers each sequence's pages separately (what a ragged batch needs).
- ``gqa``: ``grouped`` folds query heads onto their KV head and reads each KV head once;
  ``expand`` repeats K and V to every query head first (simple, more memory traffic).

The default (``num_splits=1``, ``index``, ``expand``) is the straightforward untuned version.
It is also the reference implementation GPU decode kernels are checked against.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from tunectl.core.params import Rule
from tunectl.tasks.base import DTYPE_TOLERANCE, InvalidConfig, Params, Task

_MAX_BYTES = 8 << 30


class DecodeAttention(Task):
    name = "decode_attention"
    static_params = ("dtype", "head_dim", "num_kv_heads", "num_q_heads", "page_size")
    shape_params = ("batch", "kv_len")
    config_params = ("gather", "gqa", "num_splits")
    split_params = ("num_splits",)
    wave_dims = ("batch", "kv_len")
    param_rules: ClassVar[Mapping[str, Rule]] = {
        "dtype": Rule.one_of(*DTYPE_TOLERANCE),
        "num_q_heads": Rule.integer(1, 1024),
        "num_kv_heads": Rule.integer(1, 1024),
        "head_dim": Rule.integer(1, 1024),
        "page_size": Rule.integer(1, 1 << 16),
        "gather": Rule.one_of("index", "per_seq"),
        "gqa": Rule.one_of("expand", "grouped"),
        "num_splits": Rule.integer(1, 1024),
    }

    def default_config(self, static: Params) -> dict[str, Any]:
        return {"gather": "index", "gqa": "expand", "num_splits": 1}

    def complete_config(self, config: Params) -> dict[str, Any]:
        return {**self.default_config({}), **config}

    def check_point(self, static: Params, shape: Params) -> str | None:
        if static["num_q_heads"] % static["num_kv_heads"]:
            return "num_q_heads must be a multiple of num_kv_heads"
        if static["dtype"] not in DTYPE_TOLERANCE:
            return f"unsupported dtype {static['dtype']}"
        kv_bytes = self.bytes_moved(static, shape)
        if kv_bytes > _MAX_BYTES:  # a point this large would take the worker's memory, not measure
            return f"the inputs would take {kv_bytes / 2**30:.1f} GiB (limit {_MAX_BYTES / 2**30:.0f})"
        return None

    def build_inputs(self, static: Params, shape: Params, device: str) -> dict[str, Any]:
        import torch

        gen = torch.Generator(device="cpu").manual_seed(0)
        dtype = getattr(torch, static["dtype"])
        batch, kv_len, page = shape["batch"], shape["kv_len"], static["page_size"]
        hq, hkv, d = static["num_q_heads"], static["num_kv_heads"], static["head_dim"]
        pages_per_seq = math.ceil(kv_len / page)
        num_pages = batch * pages_per_seq
        # Pages of one sequence are scattered over the pool, as a serving allocator leaves them.
        page_table = torch.randperm(num_pages, generator=gen).view(batch, pages_per_seq)

        def randn(*size: int) -> Any:
            return torch.randn(*size, generator=gen).to(device=device, dtype=dtype)

        return {
            "q": randn(batch, hq, d),
            "k_cache": randn(num_pages, page, hkv, d),
            "v_cache": randn(num_pages, page, hkv, d),
            "page_table": page_table.to(device),
            "kv_len": kv_len,
        }

    def reference(self, static: Params, shape: Params, inputs: dict[str, Any]) -> Any:
        """Straightforward attention, one sequence at a time, in float64."""
        import torch

        q, kc, vc, table, kv_len = (inputs[k] for k in ("q", "k_cache", "v_cache", "page_table", "kv_len"))
        group = q.shape[1] // kc.shape[2]
        outs = []
        for b in range(q.shape[0]):
            k = kc[table[b]].flatten(0, 1)[:kv_len].double().repeat_interleave(group, dim=1)
            v = vc[table[b]].flatten(0, 1)[:kv_len].double().repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,thd->ht", q[b].double(), k) / math.sqrt(q.shape[-1])
            outs.append(torch.einsum("ht,thd->hd", scores.softmax(-1), v))
        return torch.stack(outs).to(q.dtype)

    def prepare(
        self, static: Params, shape: Params, config: Params, inputs: dict[str, Any]
    ) -> Callable[[], Any]:
        num_splits = config.get("num_splits", 1)
        gather, gqa = config.get("gather", "index"), config.get("gqa", "expand")
        if not isinstance(num_splits, int) or num_splits < 1:
            raise InvalidConfig(f"num_splits must be a positive integer, not {num_splits!r}")
        if gather not in ("index", "per_seq") or gqa not in ("grouped", "expand"):
            raise InvalidConfig(f"unknown gather {gather!r} or gqa {gqa!r}")
        pages_per_seq = inputs["page_table"].shape[1]
        if num_splits > pages_per_seq:
            raise InvalidConfig(f"num_splits={num_splits} exceeds the {pages_per_seq} pages per sequence")
        return lambda: split_kv_decode(inputs, num_splits, gather, gqa)

    def tolerance(self, static: Params) -> tuple[float, float]:
        return DTYPE_TOLERANCE[static["dtype"]]

    def bytes_moved(self, static: Params, shape: Params) -> int:
        itemsize = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}[static["dtype"]]
        kv = 2 * shape["batch"] * shape["kv_len"] * static["num_kv_heads"] * static["head_dim"]
        qo = 2 * shape["batch"] * static["num_q_heads"] * static["head_dim"]
        return (kv + qo) * itemsize


def split_kv_decode(inputs: dict[str, Any], num_splits: int, gather: str, gqa: str) -> Any:
    import torch

    q, kc, vc, table, kv_len = (inputs[k] for k in ("q", "k_cache", "v_cache", "page_table", "kv_len"))
    batch, hq, d = q.shape
    page, hkv = kc.shape[1], kc.shape[2]
    group = hq // hkv
    pages_per_split = math.ceil(table.shape[1] / num_splits)
    qs = (q.float() / math.sqrt(d)).view(batch, hkv, group, d)
    partial_out, partial_lse = [], []
    for first in range(0, table.shape[1], pages_per_split):
        ids = table[:, first : first + pages_per_split]
        tokens = min(kv_len - first * page, ids.shape[1] * page)
        if gather == "index":
            k, v = kc[ids], vc[ids]
        else:
            k = torch.stack([kc.index_select(0, row) for row in ids])
            v = torch.stack([vc.index_select(0, row) for row in ids])
        k = k.flatten(1, 2)[:, :tokens].float()  # [batch, tokens, hkv, d]
        v = v.flatten(1, 2)[:, :tokens].float()
        if gqa == "grouped":
            scores = torch.einsum("bhgd,bthd->bhgt", qs, k)
        else:
            k = k.repeat_interleave(group, dim=2)
            v = v.repeat_interleave(group, dim=2)
            scores = torch.einsum("bqd,btqd->bqt", qs.view(batch, hq, d), k).view(batch, hkv, group, -1)
        top = scores.amax(-1, keepdim=True)
        weights = (scores - top).exp()
        denom = weights.sum(-1, keepdim=True)
        if gqa == "grouped":
            out = torch.einsum("bhgt,bthd->bhgd", weights, v)
        else:
            out = torch.einsum("bqt,btqd->bqd", weights.view(batch, hq, -1), v).view(batch, hkv, group, d)
        partial_out.append(out / denom)
        partial_lse.append(top + denom.log())
    lse = torch.stack(partial_lse)  # [splits, batch, hkv, group, 1]
    scale = (lse - lse.amax(0, keepdim=True)).exp()
    out = (torch.stack(partial_out) * scale).sum(0) / scale.sum(0)
    return out.view(batch, hq, d).to(q.dtype)
