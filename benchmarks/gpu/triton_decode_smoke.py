"""A quick look at the Triton split-KV decode kernel on a GPU: a handful of configs at three long-context
points, page 16 and 128, timed as a tuning run times them.

bf16, 32 query / 8 KV heads, head dim 128, one query token (configs/h200/flash_decode.toml's
static key). Each config is prepared through the ``flash_decode`` task, its output checked against the
task's reference (max abs error shown), then timed with the project's sampler as the H200 specs time
it: CUDA graphs, cold L2, the difference method (K x (flush, call) minus K flushes), adaptive sampling
(``tunectl.measure.timing.make_sampler``, ``tunectl.measure.harness.measure``).
Achieved bandwidth is the task's ``bytes_moved`` over the median; % roof is against ``--roof-tbps``.
About a minute on an H200, most of it Triton compiles.

    python benchmarks/gpu/triton_decode_smoke.py [--roof-tbps 4.3] [--baseline]   # --baseline: fa4 too
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tunectl.core.record import Timing
from tunectl.core.spec import L2, MeasureMode, MeasureSpec, load_spec
from tunectl.measure.harness import measure
from tunectl.measure.timing import make_sampler
from tunectl.tasks import _adapters_triton
from tunectl.tasks.base import InvalidConfig
from tunectl.tasks.flash_decode import FlashDecode

ROOT = Path(__file__).resolve().parents[2]
# the H200 decode spec's static key, less the page size each run sets
STATIC = {k: v for k, v in load_spec(ROOT / "configs/h200/flash_decode.toml").static_grid()[0]
          if k != "page_size"}  # fmt: skip
POINTS = [(1, 32768), (4, 8192), (4, 32768)]
PAGES = [16, 128]
T = {"backend": "triton"}
CONFIGS: list[dict[str, Any]] = [
    T,  # the untuned call: the split heuristic
    {**T, "num_kv_splits": 1},
    {**T, "num_kv_splits": 8},
    {**T, "num_kv_splits": 16},
    {**T, "num_kv_splits": 32},
    {**T, "num_kv_splits": 64},
    {**T, "num_kv_splits": 32, "BLOCK_N": 32},
    {**T, "num_kv_splits": 16, "BLOCK_N": 128, "num_warps": 8},
    {**T, "num_kv_splits": 32, "num_stages": 3},
]
SETTINGS = MeasureSpec(
    warmup=3,
    min_samples=10,
    max_samples=300,
    noise_target=0.01,
    max_seconds=0.25,
    l2=L2.COLD,
    mode=MeasureMode.GRAPH,
)


def label(config: dict[str, Any]) -> str:
    rest = {k: v for k, v in config.items() if k != "backend"}
    return config["backend"] + (" " + " ".join(f"{k}={v}" for k, v in rest.items()) if rest else " (default)")


def time_config(task: FlashDecode, static: dict, shape: dict, config: dict, inputs: Any, ref: Any) -> dict:
    """One config at one point: error against the reference, then the sampled times."""
    import torch

    try:
        fn = task.prepare(static, shape, config, inputs)
        out = fn()
        torch.cuda.synchronize()
    except InvalidConfig as exc:
        return {"status": f"invalid: {exc}"}
    except Exception as exc:  # a library that is not installed, a compile failure: shown, not fatal
        return {"status": f"error: {type(exc).__name__}: {str(exc)[:120]}"}
    err = float((out.float() - ref.float()).abs().max())
    stats = measure(make_sampler(fn, "cuda:0", "graph", "cold", Timing.DIFFERENCE), SETTINGS)
    return {"status": "ok", "err": err, "stats": stats}


def heuristic(static: dict, shape: dict) -> int:
    import torch

    blocks = _adapters_triton.head_blocks(static, shape["q_len"], _adapters_triton.DEFAULTS["BLOCK_H"])
    return _adapters_triton.heuristic_splits(
        batch=shape["batch"], num_kv_heads=static["num_kv_heads"], head_blocks=blocks,
        kv_len=shape["kv_len"], num_sms=torch.cuda.get_device_properties(0).multi_processor_count,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--roof-tbps", type=float, default=4.3, help="copy bandwidth taken as the roof")
    parser.add_argument("--baseline", action="store_true", help="also time flash-attn-4's untuned call")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA device", file=sys.stderr)
        return 2
    started = time.perf_counter()
    task = FlashDecode()
    configs = CONFIGS + ([{"backend": "fa4"}] if args.baseline else [])
    print(f"{torch.cuda.get_device_name(0)}; graphs, cold L2, difference timing; roof {args.roof_tbps} TB/s")
    print(f"{'page':>4} {'point':>9} {'config':<48} {'median us':>10} {'p20-p80 us':>15} {'TB/s':>6} "
          f"{'% roof':>6} {'max err':>9}")  # fmt: skip
    for page in PAGES:
        for batch, kv_len in POINTS:
            static, shape = {**STATIC, "page_size": page}, {"batch": batch, "kv_len": kv_len, "q_len": 1}
            inputs = task.build_inputs(static, shape, "cuda:0")
            ref = task.reference(static, shape, inputs)
            moved = task.bytes_moved(static, shape)
            best: tuple[float, str] | None = None
            for config in configs:
                result = time_config(task, static, shape, config, inputs, ref)
                name = label(config)
                point = f"{batch}x{kv_len}"
                if result["status"] != "ok":
                    print(f"{page:>4} {point:>9} {name:<48} {result['status']}")
                    continue
                s = result["stats"]
                tbps = moved / (s.median_us * 1e-6) / 1e12
                print(f"{page:>4} {point:>9} {name:<48} {s.median_us:>10.1f} "
                      f"{s.p20_us:>7.1f}-{s.p80_us:<7.1f} {tbps:>6.2f} {100 * tbps / args.roof_tbps:>5.0f}% "
                      f"{result['err']:>9.2e}")  # fmt: skip
                if best is None or s.median_us < best[0]:
                    best = (s.median_us, name)
            roof_us = moved / (args.roof_tbps * 1e12) * 1e6
            if best is not None:
                print(f"{'':>4} {'':>9} best: {best[1]} {best[0]:.1f} us (roof {roof_us:.1f} us; "
                      f"the heuristic chose {heuristic(static, shape)} splits)")  # fmt: skip
            del inputs, ref
            torch.cuda.empty_cache()
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
