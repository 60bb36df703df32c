"""How each timing method reads the same kernels on one GPU, as a markdown table.

Methods, all with a cold L2:

- ``replay``: a graph of one call replayed between events, the L2 written over before each sample
  outside the graph (tunectl's earlier method; ``measure.timing = "replay"``);
- ``difference, write flush`` / ``difference, read flush``: a graph of K x (flush, call) minus a
  graph of K flushes, over K (``tunectl.measure.difference``), with the flush that zeroes a buffer twice the
  L2, or the one that sums it (``FLUSH`` picks one for tunectl);
- ``difference, read flush, 1x L2`` / ``1.5x L2``: the read flush over a buffer of one and one and a
  half L2 sizes instead of two: where these read as the 2x flush does, a smaller flush leaves the L2
  as cold, and the GPU spends less of a measurement on flushing (each flush's own time is printed
  first);
- ``do_bench``: Triton's ``triton.testing.do_bench`` (an eager call between events per sample, its
  own L2 flush before each), median.

Kernels: copies sized to take about 10, 20, 40, 100, 400 and 2000 µs at the copy bandwidth measured
first, and flash-attn-4 and FlexAttention decode through ``flash_decode``'s prepare at batch 2 x 3000
and 1 x 32768 tokens, page 128 (the H200 spec's static parameters), with the fa4/Flex ratio per
method.

    python benchmarks/gpu/sampler_methods.py [--device cuda:0] [--seconds 0.3]   # under 3 minutes on an H200

Rows print as they are measured (the copies first, then the decode kernels, whose first call compiles).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tunectl.core.spec import MeasureSpec, load_spec
from tunectl.measure.difference import FLUSH, cuda_difference_sampler, cuda_flush
from tunectl.measure.harness import measure
from tunectl.measure.timing import make_sampler

COPY_US = (10, 20, 40, 100, 400, 2000)
POINTS = ({"batch": 2, "kv_len": 3000, "q_len": 1}, {"batch": 1, "kv_len": 32768, "q_len": 1})
BACKENDS = ("fa4", "flex")
METHODS = (
    "replay",
    "difference, write flush",
    "difference, read flush",
    "difference, read flush, 1x L2",
    "difference, read flush, 1.5x L2",
    "do_bench",
)
FLUSH_SIZES = (1.0, 1.5, 2.0)  # L2 sizes of the read flushes whose own time is printed
SPEC = Path(__file__).resolve().parents[2] / "configs" / "h200" / "flash_decode.toml"


def time_methods(fn: Callable[[], Any], device: str, settings: MeasureSpec) -> dict[str, float]:
    """Each method's median for ``fn``, in µs (``nan`` where a method is unavailable)."""
    fn()
    samplers = {
        "replay": lambda: make_sampler(fn, device, "graph", "cold", "replay"),
        "difference, write flush": lambda: cuda_difference_sampler(fn, device, "graph", flush_kind="write"),
        "difference, read flush": lambda: cuda_difference_sampler(fn, device, "graph", flush_kind="read"),
        "difference, read flush, 1x L2": lambda: cuda_difference_sampler(
            fn, device, "graph", flush_kind="read", flush_l2s=1.0
        ),
        "difference, read flush, 1.5x L2": lambda: cuda_difference_sampler(
            fn, device, "graph", flush_kind="read", flush_l2s=1.5
        ),
    }
    out = {name: measure(make(), settings).median_us for name, make in samplers.items()}
    try:
        from triton.testing import do_bench
    except ImportError:
        out["do_bench"] = float("nan")
    else:
        out["do_bench"] = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
    return out


def copy_bandwidth(device: str) -> float:
    """Bytes per µs a 1 GiB device copy moves (read + write), by warm graph replay."""
    import torch

    src = torch.ones(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    us = measure(make_sampler(lambda: dst.copy_(src), device, "graph", "warm"), MeasureSpec()).median_us
    return 2 * src.numel() / us


def copy_kernel(num_bytes: int, device: str) -> Callable[[], Any]:
    import torch

    src = torch.ones(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def decode_kernels(device: str) -> dict[str, dict[str, Callable[[], Any] | str]]:
    """Per decode point, per backend: its call through the task's prepare, or why it cannot run."""
    from tunectl.tasks.registry import get_task

    spec = load_spec(SPEC)
    [static] = [dict(s) for s in spec.static_grid() if dict(s)["page_size"] == 128]
    task = get_task("flash_decode")
    task.warm_up(device)
    kernels: dict[str, dict[str, Callable[[], Any] | str]] = {}
    for shape in POINTS:
        label = f"{shape['batch']} x {shape['kv_len']}"
        inputs = task.build_inputs(static, shape, device)
        kernels[label] = {}
        for backend in BACKENDS:
            config = task.complete_config({"backend": backend})
            try:
                kernels[label][backend] = task.prepare(static, shape, config, inputs)
            except Exception as exc:  # a library missing on this machine: say so in the table
                kernels[label][backend] = f"unavailable: {type(exc).__name__}: {exc}"[:120]
    return kernels


def _row(name: str, cells: list[str]) -> None:
    print(f"| {name} | " + " | ".join(cells) + " |")


def _cell(us: float) -> str:
    return "-" if us != us else f"{us:,.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--seconds", type=float, default=0.3, help="time cap per method and kernel")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # rows survive a timeout
    import torch

    started = time.perf_counter()
    settings = MeasureSpec(
        warmup=3, min_samples=10, max_samples=400, noise_target=0.01, max_seconds=args.seconds
    )
    props = torch.cuda.get_device_properties(args.device)
    print(f"{props.name}, L2 {props.L2_cache_size >> 20} MiB, torch {torch.__version__}; FLUSH = {FLUSH!r}\n")
    bandwidth = copy_bandwidth(args.device)
    print(f"copy bandwidth {bandwidth / 1e6:.2f} TB/s (1 GiB, warm replay)\n")
    for l2s in FLUSH_SIZES:
        flush = cuda_flush(args.device, "read", l2s)
        us = measure(make_sampler(flush, args.device, "graph", "warm"), settings).median_us
        print(f"read flush of {l2s:g}x L2: {us:.1f} µs")
    print()
    print("| kernel | " + " | ".join(f"{m} (µs)" for m in METHODS) + " |")
    print("|---|" + "---:|" * len(METHODS))
    for target in COPY_US:
        num_bytes = int(target * bandwidth / 2)
        times = time_methods(copy_kernel(num_bytes, args.device), args.device, settings)
        _row(f"copy {num_bytes / 2**20:,.1f} MiB (~{target} µs)", [_cell(times[m]) for m in METHODS])
    ratios: dict[str, dict[str, float]] = {}
    for label, backends in decode_kernels(args.device).items():
        medians: dict[str, dict[str, float]] = {}
        for backend, fn in backends.items():
            if isinstance(fn, str):
                _row(f"{backend} {label} page 128", [fn])
                continue
            try:
                medians[backend] = time_methods(fn, args.device, settings)
            except Exception as exc:  # a kernel that fails here leaves its row, not the table
                _row(f"{backend} {label} page 128", [f"failed: {type(exc).__name__}: {exc}"[:120]])
                continue
            _row(f"{backend} {label} page 128", [_cell(medians[backend][m]) for m in METHODS])
        if len(medians) == 2:
            ratios[label] = {m: medians["fa4"][m] / medians["flex"][m] for m in METHODS}
    print("\n| fa4 / flex | " + " | ".join(METHODS) + " |")
    print("|---|" + "---:|" * len(METHODS))
    for label, by_method in ratios.items():
        _row(label, [f"{by_method[m]:.3f}" for m in METHODS])
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
