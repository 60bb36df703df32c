"""How the drift guard's reference splits between its copy and its matrix product on this GPU.

    python benchmarks/gpu/reference_parts.py [--device cuda:0]      # seconds, on a GPU host

The reference (``tunectl.measure.reference.reference_parts``) is a copy of twice the L2 and a bf16 matrix
product; the share of each in its time is how much a slowdown of that side moves it. Each part and the
whole are timed as the guard times the reference (eager calls between events, a warm L2), 50 calls a
window, median of 20 windows; prints a JSON object of µs per call and the copy's share.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable


def per_call_us(fn: Callable[[], object], calls: int = 50, windows: int = 20) -> float:
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(windows):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(times)


def main() -> None:
    import torch

    from tunectl.measure import reference

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda:0")
    args = p.parse_args()
    torch.cuda.set_device(args.device)
    copy, product = reference.reference_parts(args.device)
    copy_us, product_us = per_call_us(copy), per_call_us(product)
    whole_us = per_call_us(reference.reference_kernel(args.device))
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(args.device),
                "l2_bytes": torch.cuda.get_device_properties(args.device).L2_cache_size,
                "copy_us": round(copy_us, 2),
                "product_us": round(product_us, 2),
                "reference_us": round(whole_us, 2),
                "copy_share": round(copy_us / (copy_us + product_us), 3),
            }
        )
    )


if __name__ == "__main__":
    main()
