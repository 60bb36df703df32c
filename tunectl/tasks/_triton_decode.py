"""Split-KV paged decode attention in Triton: one pass over KV splits, then a merge of the splits.

Layouts (the ``flash_decode`` task's): queries and outputs ``[batch, q_len, num_q_heads, head_dim]``;
K and V caches ``[num_pages, page_size, num_kv_heads, head_dim]`` (NHD pages, any page size); a page
table ``[batch, pages_per_seq]`` int32 and ``seqused_k [batch]`` int32 (each sequence's cached
tokens; query token ``i`` sits at position ``seqused_k - q_len + i``).

Stage 1 runs one program per (sequence, KV head, block of ``BLOCK_H`` query rows, split). A KV head's
query rows are its ``group = num_q_heads / num_kv_heads`` heads times the ``q_len`` query tokens, so
one program reads each K/V token of its split once for all of them (GQA grouping). The visible
range of a sequence (``[max(0, kv_len - q_len - left), kv_len)``) is cut into ``num_kv_splits``
chunks of whole ``BLOCK_N`` blocks; each step gathers ``BLOCK_N`` tokens through the page table,
token by token, so any page size works. Scores are masked per row (causal, sliding window), soft-
capped if asked, and folded into an online softmax in float32 (base-2 exponentials). Each split
writes its normalised partial output and its log-sum-exp (base 2; ``-inf`` for an empty split) to a
float32 workspace; stage 2 merges the splits of each (sequence, token, head) and adds the sink
logit, if any, to the denominator. With one split (``num_kv_splits == 1``) stage 1 writes the
output itself and stage 2 is not launched.

``decode_call`` allocates the output and the workspace once and returns a call that only launches
kernels: no allocation, no host synchronisation (the lengths are read on the device), so it can be
captured into a CUDA graph and replayed. The kernels depend on the static parameters, ``q_len`` and
the launch options, not on batch, lengths or the split count (the arguments that change with those
are not specialised), so one build serves every shape.

Importing this module imports Triton; with ``TRITON_INTERPRET=1`` set before that import the kernels
run in Triton's interpreter on CPU tensors (``interpreted()``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

_LOG2E = tl.constexpr(1.4426950408889634)
_NEG_INF = tl.constexpr(float("-inf"))


def interpreted() -> bool:
    """True where the kernels run in Triton's interpreter (TRITON_INTERPRET=1 at import)."""
    return not isinstance(_split_stage, triton.runtime.JITFunction)


def _interpreter_loops_take_scalars() -> None:
    """Let the interpreter's ``range`` take loaded scalars under numpy >= 2.4 (triton-lang/triton#9171).

    Triton 3.6's interpreter holds a scalar as a one-element array and turns it into a loop bound
    with ``int(array)``, which numpy 2.4 refuses for arrays that are not 0-d. Patched once, and only
    the interpreter's own patch table, which it applies while a kernel runs and restores after.
    """
    from triton.runtime import interpreter

    patch = interpreter._patch_lang_tensor
    if getattr(patch, "takes_scalars", False):
        return

    def patched(tensor: Any, scope: Any) -> None:
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.takes_scalars = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


@triton.jit
def _visible(tok, pos, CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr):
    """Bool [rows, tokens]: which tokens each query row attends to (as tunectl.tasks._masks.visible)."""
    ok = tok[None, :] >= 0
    if CAUSAL:
        ok = ok & (tok[None, :] <= pos[:, None])
    elif WINDOW_RIGHT >= 0:
        ok = ok & (tok[None, :] <= pos[:, None] + WINDOW_RIGHT)
    if WINDOW_LEFT >= 0:
        ok = ok & (tok[None, :] >= pos[:, None] - WINDOW_LEFT)
    return ok


@triton.jit
def _scores(q, k, sm_scale, softcap, SOFTCAP: tl.constexpr, USE_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """q [rows, d] . k [tokens, d] -> float32 logits in base-2 units, soft-capped if asked."""
    if USE_DOT:
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    else:  # fewer than 16 rows: tensor-core tiles need 16
        s = tl.sum(q[:, None, :].to(tl.float32) * k[None, :, :].to(tl.float32), axis=2)
    s = s * sm_scale
    if SOFTCAP:
        # softcap * tanh(s / softcap), with tanh(x) = 1 - 2 / (exp(2x) + 1): finite for every x
        s = softcap * (1.0 - 2.0 / (tl.exp2(2.0 * _LOG2E * s / softcap) + 1.0))
    return s * _LOG2E


@triton.jit
def _weighted(p, v, USE_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """p [rows, tokens] @ v [tokens, d] in float32."""
    if USE_DOT:
        return tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return tl.sum(p[:, :, None] * v[None, :, :].to(tl.float32), axis=1)


@triton.jit
def _with_sink(m, denom, acc, Sinks, head, row_ok, HAS_SINKS: tl.constexpr):
    """Add each row's sink logit to the softmax denominator; the normalised output."""
    if HAS_SINKS:
        sink = tl.load(Sinks + head, mask=row_ok, other=float("-inf")).to(tl.float32) * _LOG2E
        top = tl.maximum(m, sink)
        top = tl.where(top == _NEG_INF, 0.0, top)
        scale = tl.exp2(m - top)
        denom = denom * scale + tl.exp2(sink - top)
        acc = acc * scale[:, None]
    return acc / tl.where(denom > 0, denom, 1.0)[:, None]


@triton.jit(do_not_specialize=["stride_table", "num_kv_splits"])
def _split_stage(
    Q, K, V, Table, SeqUsed, Sinks, MidO, MidLse, Out,
    sm_scale, softcap,
    stride_qb, stride_qt, stride_qh, stride_kp, stride_ks, stride_kh,
    stride_vp, stride_vs, stride_vh, stride_ob, stride_ot, stride_oh,
    stride_table, num_kv_splits,
    Q_LEN: tl.constexpr, GROUP: tl.constexpr, NUM_Q_HEADS: tl.constexpr, HEAD_BLOCKS: tl.constexpr,
    PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr, SINGLE: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    kv_head = tl.program_id(1) // HEAD_BLOCKS
    rows = (tl.program_id(1) % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(2)
    row_ok = rows < GROUP * Q_LEN
    t = rows // GROUP  # query token of each row
    head = kv_head * GROUP + rows % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    q = tl.load(
        Q + b * stride_qb + t[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :], other=0.0,
    )  # fmt: skip
    kv_len = tl.load(SeqUsed + b)
    pos = kv_len - Q_LEN + t
    lo = 0
    if WINDOW_LEFT >= 0:
        lo = tl.maximum(kv_len - Q_LEN - WINDOW_LEFT, 0)
    per_split = tl.cdiv(tl.cdiv(kv_len - lo, num_kv_splits), BLOCK_N) * BLOCK_N
    start = lo + split * per_split
    end = tl.minimum(start + per_split, kv_len)
    m, denom, acc = _attend(
        q, K, V, Table + b * stride_table, kv_head, start, end, pos, offs_d, d_ok, sm_scale, softcap,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
        PAGE_SIZE, BLOCK_N, BLOCK_H, BLOCK_D, CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, PRECISION,
    )  # fmt: skip
    _store_split(
        m, denom, acc, Sinks, MidO, MidLse, Out, b, t, head, split, row_ok, d_ok, offs_d,
        stride_ob, stride_ot, stride_oh, num_kv_splits, Q_LEN, NUM_Q_HEADS, HEAD_DIM, HAS_SINKS, SINGLE,
    )  # fmt: skip


@triton.jit
def _attend(
    q, K, V, table_row, kv_head, start, end, pos, offs_d, d_ok, sm_scale, softcap,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """The online softmax of the query rows ``q`` over the tokens [start, end) of one sequence, read
    through its page table row: each row's running maximum, denominator and unnormalised output."""
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    USE_DOT: tl.constexpr = BLOCK_H >= 16
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + tl.arange(0, BLOCK_N)
        tok_ok = tok < end
        page = tl.load(table_row + tok // PAGE_SIZE, mask=tok_ok, other=0).to(tl.int64)
        slot = tok % PAGE_SIZE
        kv_mask = tok_ok[:, None] & d_ok[None, :]
        k = tl.load(
            K + page[:, None] * stride_kp + slot[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :],
            mask=kv_mask, other=0.0,
        )  # fmt: skip
        s = _scores(q, k, sm_scale, softcap, SOFTCAP, USE_DOT, PRECISION)
        ok = _visible(tok, pos, CAUSAL, WINDOW_LEFT, WINDOW_RIGHT) & tok_ok[None, :]
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        # a row that has seen nothing yet keeps m = -inf; exponentials are taken against 0 instead
        m_use = tl.where(m_new == _NEG_INF, 0.0, m_new)
        alpha = tl.exp2(m - m_use)
        p = tl.exp2(s - m_use[:, None])
        denom = denom * alpha + tl.sum(p, 1)
        v = tl.load(
            V + page[:, None] * stride_vp + slot[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :],
            mask=kv_mask, other=0.0,
        )  # fmt: skip
        acc = acc * alpha[:, None] + _weighted(p, v, USE_DOT, PRECISION)
        m = m_new
    return m, denom, acc


@triton.jit
def _store_split(
    m, denom, acc, Sinks, MidO, MidLse, Out, b, t, head, split, row_ok, d_ok, offs_d,
    stride_ob, stride_ot, stride_oh, num_kv_splits,
    Q_LEN: tl.constexpr, NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HAS_SINKS: tl.constexpr, SINGLE: tl.constexpr,
):  # fmt: skip
    """A split's result: with one split, the output itself (the sink added); else the split's
    normalised partial output and its log-sum-exp, into the workspace."""
    if SINGLE:
        out = _with_sink(m, denom, acc, Sinks, head, row_ok, HAS_SINKS)
        ptrs = Out + b * stride_ob + t[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    else:
        lse = tl.where(denom > 0, m + tl.log2(tl.where(denom > 0, denom, 1.0)), float("-inf"))
        o = acc / tl.where(denom > 0, denom, 1.0)[:, None]
        idx = ((b * Q_LEN + t) * NUM_Q_HEADS + head).to(tl.int64) * num_kv_splits + split
        tl.store(MidO + idx[:, None] * HEAD_DIM + offs_d[None, :], o, mask=row_ok[:, None] & d_ok[None, :])
        tl.store(MidLse + idx, lse, mask=row_ok)


@triton.jit(do_not_specialize=["num_kv_splits"])
def _merge_stage(
    MidO, MidLse, Sinks, Out, stride_ob, stride_ot, stride_oh, num_kv_splits,
    Q_LEN: tl.constexpr, NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    row = tl.program_id(1)  # token * NUM_Q_HEADS + head
    t = row // NUM_Q_HEADS
    head = row % NUM_Q_HEADS
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    base = (b * Q_LEN * NUM_Q_HEADS + row).to(tl.int64) * num_kv_splits
    m = tl.full([1], float("-inf"), tl.float32)
    denom = tl.zeros([1], tl.float32)
    acc = tl.zeros([1, BLOCK_D], tl.float32)
    for split in range(num_kv_splits):
        lse = tl.load(MidLse + base + split + tl.zeros([1], tl.int32))
        o = tl.load(MidO + (base + split) * HEAD_DIM + offs_d[None, :], mask=d_ok[None, :], other=0.0)
        m_new = tl.maximum(m, lse)
        m_use = tl.where(m_new == _NEG_INF, 0.0, m_new)
        alpha = tl.exp2(m - m_use)
        w = tl.exp2(lse - m_use)
        denom = denom * alpha + w
        acc = acc * alpha[:, None] + w[:, None] * o
        m = m_new
    out = _with_sink(m, denom, acc, Sinks, head + tl.zeros([1], tl.int32), m == m, HAS_SINKS)
    ptrs = Out + b * stride_ob + t * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(ptrs, out.to(Out.dtype.element_ty), mask=d_ok[None, :])


def _workspace(q: Any, num_kv_splits: int) -> tuple[Any, Any]:
    """The splits' float32 partial outputs and log-sum-exps, per (sequence, token, head, split); empty
    with one split (stage 1 then writes the output)."""
    import torch

    if num_kv_splits == 1:
        return q.new_empty((), dtype=torch.float32), q.new_empty((), dtype=torch.float32)
    rows = (*q.shape[:3], num_kv_splits)
    return q.new_empty((*rows, q.shape[3]), dtype=torch.float32), q.new_empty(rows, dtype=torch.float32)


def decode_call(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    page_table: Any,
    seqused_k: Any,
    *,
    sinks: Any = None,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    num_kv_splits: int,
    block_n: int,
    block_h: int,
    num_warps: int,
    num_stages: int,
) -> Callable[[], Any]:
    """A call computing decode attention into one output tensor, which it returns each time.

    The output and (for ``num_kv_splits > 1``) the float32 workspace are allocated here, once; the
    call launches kernels only (CUDA-graph capturable). Options are taken as given: callers check
    them first (``tunectl.tasks._adapters_triton``). ``q``'s and the caches' last dimension is contiguous.
    """
    import torch

    if interpreted():
        _interpreter_loops_take_scalars()
    batch, q_len, num_q_heads, head_dim = q.shape
    group = num_q_heads // k_cache.shape[2]
    rows = group * q_len
    head_blocks = -(-rows // block_h)
    block_d = max(16, triton.next_power_of_2(head_dim))
    out = torch.empty_like(q)
    single = num_kv_splits == 1
    mid_o, mid_lse = _workspace(q, num_kv_splits)
    consts = dict(
        Q_LEN=q_len, GROUP=group, NUM_Q_HEADS=num_q_heads, HEAD_BLOCKS=head_blocks,
        PAGE_SIZE=k_cache.shape[1], HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_N=block_n, BLOCK_H=block_h,
        CAUSAL=bool(causal), WINDOW_LEFT=int(window[0]), WINDOW_RIGHT=int(window[1]),
        SOFTCAP=softcap > 0, HAS_SINKS=sinks is not None, SINGLE=single,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )  # fmt: skip
    split_args = (
        q, k_cache, v_cache, page_table, seqused_k, sinks, mid_o, mid_lse, out,
        1.0 / math.sqrt(head_dim), float(softcap),
        *q.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3], *out.stride()[:3],
        page_table.stride(0), num_kv_splits,
    )  # fmt: skip
    split_grid = (batch, k_cache.shape[2] * head_blocks, num_kv_splits)
    merge_args = (mid_o, mid_lse, sinks, out, *out.stride()[:3], num_kv_splits)
    merge_consts = dict(Q_LEN=q_len, NUM_Q_HEADS=num_q_heads, HEAD_DIM=head_dim, BLOCK_D=block_d,
                        HAS_SINKS=sinks is not None)  # fmt: skip
    launch = dict(num_warps=num_warps, num_stages=num_stages)

    def call() -> Any:
        _split_stage[split_grid](*split_args, **consts, **launch)
        if not single:
            _merge_stage[(batch, q_len * num_q_heads)](*merge_args, **merge_consts, num_warps=4)
        return out

    return call
