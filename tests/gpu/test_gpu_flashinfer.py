"""The FlashInfer decode backend against the reference on a GPU, eagerly and replayed in a CUDA graph
(its arguments, config rules, compile key and cache on CPU: tests/unit/test_flashinfer.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_flashinfer import STATIC
from tunectl.tasks.flash_decode import FlashDecode

torch = pytest.importorskip("torch")


GPU_STATIC = {**STATIC, "head_dim": 128, "num_q_heads": 32, "num_kv_heads": 8}


GPU_CONFIGS = [
    {"backend": "flashinfer"},
    {"backend": "flashinfer", "use_tensor_cores": True},
    {"backend": "flashinfer", "use_tensor_cores": True, "fixed_split_size": 32},  # page 16: 4 splits
    {"backend": "flashinfer", "use_tensor_cores": True, "disable_split_kv": True},
    {"backend": "flashinfer", "kv_layout": "HND"},
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("variant", [{}, {"window": (300, 0)}, {"softcap": 30.0}, {"page_size": 128}])
@pytest.mark.parametrize("config", GPU_CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_flashinfer_matches_the_reference_eagerly_and_replayed_in_a_cuda_graph(
    config: dict[str, Any], variant: dict[str, Any]
) -> None:
    from tunectl.measure.timing import make_sampler
    from tunectl.tasks.base import DTYPE_TOLERANCE

    static, shape = {**GPU_STATIC, **variant}, {"batch": 4, "kv_len": 2000, "q_len": 1}
    task = FlashDecode()
    inputs = task.build_inputs(static, shape, "cuda")
    ref = task.reference(static, shape, inputs)
    call = task.prepare(static, shape, config, inputs)
    atol, rtol = DTYPE_TOLERANCE[static["dtype"]]
    torch.testing.assert_close(call().float(), ref.float(), atol=atol, rtol=rtol)
    sample = make_sampler(call, "cuda", "graph", "cold")  # captures run() alone, as serving replays it
    out = call()
    out.zero_()  # the graph writes the same buffer: only a replay can refill it now
    assert sample() > 0
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_fixed_split_finer_than_the_graph_grid_holds_is_refused_as_an_invalid_config() -> None:
    from tunectl.tasks.base import InvalidConfig

    # batch 4 x 125 pages of 16, cut every 4 pages: 128 work units, more than flashinfer's graph plan holds
    static, shape = dict(GPU_STATIC), {"batch": 4, "kv_len": 2000, "q_len": 1}
    config = {"backend": "flashinfer", "use_tensor_cores": True, "fixed_split_size": 4}
    task = FlashDecode()
    inputs = task.build_inputs(static, shape, "cuda")
    with pytest.raises(InvalidConfig, match="fixed_split_size"):
        task.prepare(static, shape, config, inputs)()
