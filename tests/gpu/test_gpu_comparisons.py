"""Comparisons on a real GPU (``gpu`` marker): several configs checked, captured and timed in one process.

A comparison keeps every arm's CUDA-graph sampler and times them all after the last arm is checked,
so a graph must keep the memory it replays alive after its arm's call is dropped
(``tunectl.measure.difference``). Held-out shapes are not whole numbers of pages and their batches
are odd; 14 x 1452 tokens in pages of 128 is one of them.
"""

from __future__ import annotations

import gc
import importlib.util
import weakref
from typing import Any

import pytest

from tests.decode_keys import flash_static
from tunectl.core.keys import key_text, make_key
from tunectl.core.plan import comparison
from tunectl.core.record import Phase, Timing
from tunectl.core.spec import L2, MeasureMode, MeasureSpec

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

STATIC = flash_static(page_size=128)
SHAPE = {"batch": 14, "kv_len": 1452, "q_len": 1}
# the spec's measurement (configs/h200/flash_decode.toml): graphs, a cold L2, the difference method
SETTINGS = MeasureSpec(
    warmup=3, min_samples=10, max_samples=400, noise_target=0.01, max_seconds=0.25,
    l2=L2.COLD, mode=MeasureMode.GRAPH, timing=Timing.DIFFERENCE,
)  # fmt: skip
TORCH_ARMS: list[dict[str, Any]] = [
    {"backend": "sdpa"},
    {"backend": "triton"},
    *({"backend": "triton", "num_kv_splits": s, "BLOCK_N": 64} for s in (1, 8, 32)),
    {"backend": "sdpa", "sdpa_backend": "cudnn", "sdpa_gqa": "expand"},
    {"backend": "triton", "num_kv_splits": 16, "BLOCK_N": 128, "num_warps": 8},
    {"backend": "sdpa", "sdpa_backend": "flash"},
    {"backend": "flex"},
]
# backends of their own libraries, where installed (each may be invalid at this point, never an error)
LIBRARY_ARMS: list[tuple[str, dict[str, Any]]] = [
    ("flash_attn.cute", {"backend": "fa4"}),
    ("flash_attn_interface", {"backend": "fa3"}),
    ("flash_attn_interface", {"backend": "fa3", "num_splits": 8}),
    ("flashinfer", {"backend": "flashinfer"}),
    ("flashinfer", {"backend": "flashinfer", "use_tensor_cores": True}),
]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def test_a_graph_replay_keeps_the_call_it_captured_and_the_memory_the_call_owns() -> None:
    from tunectl.measure.graphs import graph_of

    cache = torch.randn(64, 16, device="cuda")
    out = torch.empty(16, device="cuda")

    def make_call() -> Any:
        table = torch.randperm(64, device="cuda")[:8]  # owned by the call alone, as sdpa's page table is

        def call() -> None:
            torch.sum(cache[table], dim=0, out=out)

        return call, table.clone()

    call, table = make_call()
    replay = graph_of(call, "cuda")
    alive = weakref.ref(call)
    del call
    gc.collect()
    assert alive() is not None  # else its page table is freed, and handed to the tensors made next:
    junk = [torch.full((8,), 1 << 40, dtype=torch.int64, device="cuda") for _ in range(64)]
    out.zero_()
    replay()
    torch.cuda.synchronize()
    assert torch.allclose(out, cache[table].sum(0))
    del junk


def test_a_holdout_comparison_of_many_configs_at_an_odd_point_checks_and_times_every_arm() -> None:
    from tunectl.measure.runner import ItemRunner

    arms = TORCH_ARMS + [config for module, config in LIBRARY_ARMS if _installed(module)]
    item = comparison(
        "flash_decode", make_key(STATIC), make_key(SHAPE), tuple(make_key(a) for a in arms), Phase.HOLDOUT, 4
    )
    records = ItemRunner("cuda:0").run("gpu-holdout", item, SETTINGS)
    assert isinstance(records, list)
    for rec in records:
        print(f"{rec.status:<8} {rec.median_us or 0:8.2f} us {rec.config_key} {(rec.message or '')[:160]!r}")
    statuses = {rec.config_key: rec.status for rec in records}
    assert all(status in ("ok", "invalid") for status in statuses.values()), statuses
    # SDPA may refuse a backend forced on it here; every other torch-only arm must run
    must_run = [key_text(make_key(a)) for a in TORCH_ARMS if "sdpa_backend" not in a]
    assert all(statuses[k] == "ok" for k in must_run), statuses
