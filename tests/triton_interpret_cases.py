"""The triton decode backend in Triton's CPU interpreter: run as ``python -m tests.triton_interpret_cases``.

The interpreter is chosen when triton is first imported (``TRITON_INTERPRET=1``), so these cases run in
a process of their own (tests/kernels/test_flash_decode_triton.py starts it). Each case prepares one config
through the task, runs it and compares it with the task's reference; one JSON line per case.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from tests.decode_keys import flash_static

STATIC = flash_static(dtype="float32", head_dim=16, num_kv_heads=2, num_q_heads=4)
SHAPE = {"batch": 2, "kv_len": 37, "q_len": 1}
T = {"backend": "triton"}
# (static overrides, shape overrides, config): 37 tokens are 3 blocks of 16 and 2 of 32, so the
# larger split counts leave some splits empty.
CASES: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ({}, {}, T),
    ({}, {}, {**T, "num_kv_splits": 1, "BLOCK_N": 16, "BLOCK_H": 16}),
    ({}, {}, {**T, "num_kv_splits": 2, "BLOCK_N": 16, "BLOCK_H": 2}),
    ({}, {}, {**T, "num_kv_splits": 8, "BLOCK_N": 32, "BLOCK_H": 16}),
    ({"page_size": 1}, {}, {**T, "num_kv_splits": 3, "BLOCK_N": 16, "BLOCK_H": 1}),
    ({"page_size": 1}, {}, {**T, "num_kv_splits": 5, "BLOCK_N": 32, "BLOCK_H": 16}),
    ({"page_size": 1, "head_dim": 32}, {}, {**T, "num_kv_splits": 1, "BLOCK_N": 16, "BLOCK_H": 2}),
    ({"head_dim": 32, "dtype": "float16"}, {}, {**T, "num_kv_splits": 4, "BLOCK_N": 16, "BLOCK_H": 16}),
    ({"head_dim": 24}, {"batch": 3}, {**T, "num_kv_splits": 3, "BLOCK_N": 16, "BLOCK_H": 2}),
    ({"num_q_heads": 8}, {"q_len": 3}, {**T, "num_kv_splits": 3, "BLOCK_N": 16, "BLOCK_H": 16}),
    ({"num_q_heads": 8}, {"q_len": 3}, {**T, "num_kv_splits": 1, "BLOCK_N": 16, "BLOCK_H": 4}),
    ({"window": (9, 0), "softcap": 4.0}, {"q_len": 2}, {**T, "num_kv_splits": 4, "BLOCK_N": 16}),
    ({"causal": False, "window": (5, -1)}, {"q_len": 3}, {**T, "num_kv_splits": 2, "BLOCK_N": 16}),
    ({"causal": False}, {}, {**T, "num_kv_splits": 3, "BLOCK_N": 16, "BLOCK_H": 2}),
    ({"sinks": True}, {}, {**T, "num_kv_splits": 3, "BLOCK_N": 16}),
    ({"sinks": True, "page_size": 1}, {"q_len": 2}, {**T, "num_kv_splits": 1, "BLOCK_N": 16, "BLOCK_H": 4}),
    # one KV head, batch 3 on the interpreter's one SM: the occupancy count (2) overflows, one wave takes 1
    ({"num_kv_heads": 1, "num_q_heads": 2}, {"batch": 3, "kv_len": 300}, {**T, "split_rule": "one_wave"}),
]


def run_case(static: dict[str, Any], shape: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    import torch

    from tunectl.tasks.base import InvalidConfig
    from tunectl.tasks.flash_decode import FlashDecode

    task = FlashDecode(compile_flex_on_cpu=False)
    inputs = task.build_inputs(static, shape, "cpu")
    try:
        call = task.prepare(static, shape, config, inputs)
        out, again = call(), call()
    except InvalidConfig as exc:
        return {"status": "invalid", "message": str(exc)}
    ref = task.reference(static, shape, inputs)
    atol, rtol = task.tolerance(static)
    return {
        "status": "ok",
        "max_abs_err": float((out.double() - ref.double()).abs().max()),
        "close": bool(torch.allclose(out.double(), ref.double(), atol=atol, rtol=rtol)),
        "same_output_tensor": out is again,
        "out_shape": list(out.shape),
        "ref_shape": list(ref.shape),
    }


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    for static, shape, config in CASES:
        result = run_case({**STATIC, **static}, {**SHAPE, **shape}, config)
        print(json.dumps({"static": static, "shape": shape, "config": config, **result}), flush=True)
    bf16 = run_case({**STATIC, "dtype": "bfloat16"}, SHAPE, T)
    print(json.dumps({"static": {"dtype": "bfloat16"}, "shape": {}, "config": T, **bf16}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
