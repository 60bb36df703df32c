"""FlashInfer's decode (both paths) and flash-attn 3 on one GPU, through the decode task as a run uses it.

    python benchmarks/gpu/flashinfer_smoke.py [--pages 16 128] [--cache DIR] [--max-seconds 0.25]

At batch x kv_len 1 x 32768, 4 x 8192 and 4 x 32768 (bf16, 32 query / 8 KV heads, head dim 128, one
query token), page sizes 16 and 128, each config goes the way a tuning run takes it: the task's
inputs and reference, ``FlashDecode.prepare``, a first call (FlashInfer plans and JIT-builds there;
its seconds are shown as ``first_s``), the output compared with the reference, then the project's
sampler (``tunectl.measure.timing.make_sampler``: CUDA-graph replay, L2 flushed before each sample) under the
adaptive stopping rule of ``tunectl.measure.harness.measure``. Printed per row: median and p20-p80 in µs,
samples, the median against the ~4.3 TB/s copy roof, and the max abs error against the reference.

FlashInfer's JIT modules are built into ``--cache`` (default: tunectl's compile cache in the temp
dir), as a run's compile processes build them; the first run on a machine builds two modules
(10-23 s each), later runs load them. Exit status 1 if any config raised or gave a wrong output.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tunectl.core.spec import load_spec  # noqa: E402
from tunectl.tasks.compile import cache_env  # noqa: E402

SHAPES = [(1, 32768), (4, 8192), (4, 32768)]
CONFIGS: list[dict[str, Any]] = [
    {"backend": "flashinfer"},
    {"backend": "flashinfer", "use_tensor_cores": True},
    {"backend": "fa3"},
    {"backend": "fa3", "num_splits": 16},
]
# the H200 decode spec's static key, less the page size each run sets
STATIC = {k: v for k, v in load_spec(ROOT / "configs/h200/flash_decode.toml").static_grid()[0]
          if k != "page_size"}  # fmt: skip
ROOF_BYTES_PER_S = 4.3e12  # device-to-device copy on an H200


def main() -> int:
    args = _args()
    os.environ.update(cache_env(args.cache))  # before flashinfer is imported: it reads them then
    import torch

    from tunectl.core.spec import L2, MeasureMode, MeasureSpec
    from tunectl.tasks.flash_decode import FlashDecode

    if not torch.cuda.is_available():
        print("error: needs a CUDA device", file=sys.stderr)
        return 2
    settings = MeasureSpec(warmup=3, min_samples=10, max_samples=400, noise_target=0.01,
                           max_seconds=args.max_seconds, l2=L2.COLD, mode=MeasureMode.GRAPH)  # fmt: skip
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {_versions()}, cache {args.cache}")
    print(f"{'page':>4} {'batch x kv_len':>14}  {'config':<42} {'median_us':>9} {'p20-p80':>15} "
          f"{'n':>4} {'roof':>6} {'max_abs_err':>11} {'first_s':>7}  status")  # fmt: skip
    started, failed = time.perf_counter(), 0
    task = FlashDecode()
    for page in args.pages:
        static = {**STATIC, "page_size": page}
        for batch, kv_len in SHAPES:
            shape = {"batch": batch, "kv_len": kv_len, "q_len": 1}
            inputs = task.build_inputs(static, shape, "cuda")
            ref = task.reference(static, shape, inputs)
            roof_us = task.bytes_moved(static, shape) / ROOF_BYTES_PER_S * 1e6
            for config in CONFIGS:
                row, ok = _row(task, static, shape, config, inputs, ref, settings, roof_us)
                failed += not ok
                print(f"{page:>4} {f'{batch} x {kv_len}':>14}  {_label(config):<42} {row}", flush=True)
            del inputs, ref
            torch.cuda.empty_cache()
    print(f"# {time.perf_counter() - started:.1f} s in all; {failed} config(s) raised or were wrong")
    return 1 if failed else 0


def _row(task: Any, static: dict[str, Any], shape: dict[str, Any], config: dict[str, Any],
         inputs: Any, ref: Any, settings: Any, roof_us: float) -> tuple[str, bool]:  # fmt: skip
    """One config's printed columns, and False if it raised or its output is wrong."""
    import torch

    from tunectl.measure.harness import measure
    from tunectl.measure.timing import make_sampler
    from tunectl.tasks.base import InvalidConfig

    try:
        t0 = time.perf_counter()
        call = task.prepare(static, shape, config, inputs)
        out = call()
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        err = float((out.float() - ref.float()).abs().max())
        atol, rtol = task.tolerance(static)
        if not torch.allclose(out.float(), ref.float(), atol=atol, rtol=rtol):
            return f"{'':>9} {'':>15} {'':>4} {'':>6} {err:>11.3g} {first_s:>7.1f}  wrong_result", False
        stats = measure(make_sampler(call, "cuda", "graph", "cold"), settings)
    except InvalidConfig as exc:
        return f"{'':>61}  invalid: {exc}", True
    except ImportError as exc:
        return f"{'':>61}  not installed: {exc}", True
    except Exception as exc:  # reported, and the next config runs
        return f"{'':>61}  error: {type(exc).__name__}: {str(exc)[:200]}", False
    spread = f"{stats.p20_us:.1f}-{stats.p80_us:.1f}"
    return (f"{stats.median_us:>9.1f} {spread:>15} {stats.num_samples:>4} {stats.median_us / roof_us:>5.2f}x "
            f"{err:>11.3g} {first_s:>7.1f}  ok"), True  # fmt: skip


def _label(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def _versions() -> str:
    from importlib import metadata

    found = []
    for name in ("flashinfer-python", "flash-attn-3", "flash_attn_3"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found) or "no FlashInfer / flash-attn 3 distribution found"


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, nargs="+", default=[16, 128], help="page sizes (tokens)")
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "tunectl-compile-cache"),
                        help="compile cache root (FlashInfer's JIT modules go under it)")  # fmt: skip
    parser.add_argument("--max-seconds", type=float, default=0.25, help="sampling time cap per config")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(main())
