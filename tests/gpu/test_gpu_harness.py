"""The timing harness and the NVML readings on a GPU (their logic: tests/unit/test_nvml_readings.py)."""

from __future__ import annotations

import pytest

from tunectl.measure import nvml, timing

torch = pytest.importorskip("torch")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_graph_replay_times_a_copy_near_the_copy_roof() -> None:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for l2 in ("warm", "cold"):
        sample = timing.make_sampler(lambda: dst.copy_(src), "cuda:0", "graph", l2)
        times = sorted(sample() for _ in range(20))
        tb_per_s = 2 * src.numel() / (times[10] * 1e-6) / 1e12
        print(f"graph {l2}: 1 GiB copy median {times[10]:.1f} us = {tb_per_s:.2f} TB/s")
        assert 2.0 < tb_per_s < 6.0


@pytest.mark.gpu
@needs_cuda
def test_nvml_reads_the_gpu_torch_uses() -> None:
    state = nvml.read_state("cuda:0")
    assert state is not None, "nvidia-ml-py missing or no NVML device matched"
    print(f"NVML: {state}")
    assert state.sm_clock_mhz and 100 < state.sm_clock_mhz < 3000
    assert state.temperature_c is not None and 10 < state.temperature_c < 100
    assert state.power_w is not None and state.power_w > 0
