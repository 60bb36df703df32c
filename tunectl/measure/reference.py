"""The drift guard's reference kernel (``tunectl.measure.drift``'s module doc says why it is this one):
a copy of twice the L2 and a matrix product on a GPU, a small copy and product on a CPU, and its samplers,
one per number of calls in a timed window."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tunectl.measure.harness import Sampler, chunked, take

#: the reference's sampler for ``calls`` back-to-back reference calls timed as one window (µs per call)
Reference = Callable[[int], Sampler]
#: a device's reference samplers (``reference_sampler``)
MakeReference = Callable[[str], Reference]

_REFERENCE_COPY_L2S = 2  # the copied buffer, in L2 sizes: it streams from memory, not from the cache
_REFERENCE_MATMUL_N = 4096  # bf16: ~140 µs of tensor-core work on an H200
_CPU_REFERENCE_BYTES = 8 << 20
_CPU_REFERENCE_MATMUL_N = 192


def reference_parts(device: str) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """The reference's two kernels: a copy that streams from memory, and a matrix product (module doc)."""
    import torch

    if device.startswith("cuda"):
        l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
        src = torch.ones(_REFERENCE_COPY_L2S * l2_bytes // 2, dtype=torch.bfloat16, device=device)
        n = _REFERENCE_MATMUL_N
    else:
        src = torch.ones(_CPU_REFERENCE_BYTES // 4, dtype=torch.float32)
        n = _CPU_REFERENCE_MATMUL_N
    dst = torch.empty_like(src)
    a = torch.full((n, n), 0.5, dtype=src.dtype, device=src.device)
    out = torch.empty_like(a)
    return (lambda: dst.copy_(src)), (lambda: torch.matmul(a, a, out=out))


def reference_kernel(device: str) -> Callable[[], Any]:
    """The reference: its copy, then its matrix product (``reference_parts``)."""
    copy, product = reference_parts(device)

    def reference() -> None:
        copy()
        product()

    return reference


def reference_sampler(device: str) -> Reference:
    """The reference's samplers, one per number of calls in a timed window: eager calls between events
    with a warm L2 on a GPU (the reference streams its copy from memory whatever the cache holds), the
    clock on a CPU; the same method at every check of a worker's life. Not a CUDA graph: a graph of the
    reference's matrix product, captured beside the measured kernels' graphs, left the next kernel of
    the worker reading freed memory on an H200 (an illegal address), and a ~200 µs reference call pays
    nothing measurable for its launch."""
    from tunectl.measure.timing import make_sampler

    kernel = reference_kernel(device)

    def sized(calls: int) -> Sampler:
        def window() -> None:
            for _ in range(calls):
                kernel()

        timed = make_sampler(window, device, "eager", "warm")

        return chunked(lambda n: [t / calls for t in take(timed, n)])

    return sized
