"""Which cached tokens a query attends to: the mask the decode reference and the torch adapters share."""

from __future__ import annotations

from typing import Any

from tunectl.tasks.base import Params


def visible(static: Params, kv_len: int, q_len: int, device: Any) -> Any:
    """Bool ``[q_len, kv_len]``: which cached tokens each query token attends to.

    Query token ``i`` sits at position ``kv_len - q_len + i`` (bottom-right alignment, as flash-attn);
    ``window = (left, right)`` keeps keys in ``[pos - left, pos + right]``, ``causal`` forces right = 0.
    """
    import torch

    pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    key = torch.arange(kv_len, device=device)[None, :]
    left, right = static["window"]
    ok = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    if static["causal"]:
        ok &= key <= pos
    elif right >= 0:
        ok &= key <= pos + right
    if left >= 0:
        ok &= key >= pos - left
    return ok
