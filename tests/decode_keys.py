"""flash_decode static keys the tests run at, and LightLLM's keys and lookup, written out once.

LightLLM's side is written from LightLLM's own code (``_flash_attn_kvcache_static_key``, its run key
and its ``Autotuner``'s file lookup), not from tunectl's export, so the export is checked against it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_FLASH_STATIC = {
    "causal": True,
    "dtype": "bfloat16",
    "head_dim": 128,
    "num_kv_heads": 8,
    "num_q_heads": 32,
    "page_size": 16,
    "sinks": False,
    "softcap": 0.0,
    "window": (-1, -1),
}


def flash_static(**changes: Any) -> dict[str, Any]:
    """A flash_decode static key: bf16, 32 query and 8 KV heads of 128, pages of 16, causal, no window,
    sinks or softcap; ``changes`` replace any of these."""
    unknown = set(changes) - set(_FLASH_STATIC)
    if unknown:
        raise TypeError(f"flash_decode has no static parameter {sorted(unknown)}")
    return {**_FLASH_STATIC, **changes}


def lightllm_static_key(page_size: int) -> dict[str, Any]:
    """What LightLLM's ``_flash_attn_kvcache_static_key`` computes for ``flash_static(page_size=...)``."""
    return {
        "qd": "torch.bfloat16",
        "kd": "torch.bfloat16",
        "vd": "torch.bfloat16",
        "qh": 32,
        "kh": 8,
        "hd": 128,
        "vh": 128,
        "pb": page_size,
        "c": 1,
        "wl": -1,
        "wr": -1,
        "sc": 0,
        "sk": 0,
        "has_k_descale": False,
        "has_v_descale": False,
        "sgl": "0.3.21",
    }


def decode_run_key(batch: int, kv_len: int, page_size: int) -> int:
    """LightLLM's packed run key for one decode token: batch | max_q_len (1) | pages per sequence."""
    return batch * 10**13 + 1 * 10**7 + -(-kv_len // page_size)


def lightllm_lookup(root: Path, device: str, triton: str, static_key: dict[str, Any], run_key: int) -> Any:
    """LightLLM's Autotuner, read for what it does: file by static key, exact run key else the nearest."""
    name = (
        json.dumps(static_key, sort_keys=True)
        .replace(" ", "")
        .replace("\n", "")
        .replace('"', "")
        .replace(":", "=")
    )
    device = device.replace(" ", "_")
    path = root / f"triton_{triton}" / device / "sgl_fa3_kvcache_ns:v1" / f"{name}_{device}.json"
    configs = json.loads(path.read_text())
    if str(run_key) in configs:
        return configs[str(run_key)]
    return min(configs.items(), key=lambda item: abs(int(str(run_key)) - int(item[0])))[1]
