"""Device memory a compile process's build takes, config by config, at decode points built in turn.

Builds each config as a compile process does (``tunectl.tasks.compile.build`` with the point's inputs
kept across builds, a compile cache set, so FlexAttention configs are built into packages) and
reports, per build: the seconds, the memory held before it (the point's inputs and what earlier
builds left), the peak this process allocated and reserved, and the peak the whole device used
(polled, so a package's check in a process of its own counts). With ``--trace``, the largest
allocations of each build are listed with where they were made.

    python benchmarks/gpu/compile_memory.py --page 16 --points 16x16384,32x16384,64x16384 \
        --out /tmp/compile-mem
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

GIB = 1 << 30
DEVICE = "cuda:0"
FLEX = ({"backend": "flex"}, {"backend": "flex", "num_stages": 3},
        {"backend": "flex", "num_warps": 4, "num_stages": 2})  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--points", default="64x16384", help="BATCHxKV_LEN,... built one after another")
    ap.add_argument("--configs", default=None, help="a JSON list of configs (default: the spec's Flex ones)")
    ap.add_argument("--cache", default=None, help="compile cache root (default: a new empty folder)")
    ap.add_argument("--trace", action="store_true", help="list each build's largest allocations")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from tunectl.tasks.compile import cache_env

    root = args.cache or tempfile.mkdtemp(prefix="compile-mem-")
    os.environ.update(cache_env(root))
    import torch

    from tunectl.core.registry import get_task

    task = get_task("flash_decode")
    static = {"dtype": "bfloat16", "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128,
              "page_size": args.page, "causal": True, "window": [-1, -1], "softcap": 0.0,
              "sinks": False}  # fmt: skip
    configs = json.loads(args.configs) if args.configs else list(FLEX)
    rows = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for point in args.points.split(","):
        batch, kv_len = (int(x) for x in point.split("x"))
        shape = {"batch": batch, "kv_len": kv_len, "q_len": 1}
        inputs = None  # as a compile process does: the old point's inputs go before the new ones come
        inputs = task.build_inputs(static, dict(shape), DEVICE)
        torch.cuda.synchronize()
        rows += [_build_one(task, static, shape, config, inputs, args.trace) for config in configs]
    (out / "compile_memory.json").write_text(json.dumps({"static": static, "rows": rows}, indent=1))
    return 0


def _build_one(task: Any, static: dict, shape: dict, config: Any, inputs: Any, trace: bool) -> dict:
    """One build, as a compile process runs it, with the memory it took and what it left behind."""
    import gc

    import torch

    from tunectl.tasks.compile import build, release

    held = torch.cuda.memory_allocated()  # the point's inputs, and whatever earlier builds left
    free0, total = torch.cuda.mem_get_info()

    torch.cuda.reset_peak_memory_stats()
    peak_used = [total - torch.cuda.mem_get_info()[0]]
    stop = threading.Event()

    def poll(peak: list[int] = peak_used, stop: threading.Event = stop) -> None:
        while not stop.wait(0.02):
            peak[0] = max(peak[0], total - torch.cuda.mem_get_info()[0])

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    if trace:
        torch.cuda.memory._record_memory_history(max_entries=200000)
    started = time.perf_counter()
    try:
        build(task, static, shape, config, DEVICE, lambda s, sh: inputs)
        status = "ok"
    except Exception as exc:  # a failed build is a row, not the end of the study
        status = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    seconds = time.perf_counter() - started
    stop.set()
    watcher.join()
    row = {"point": f"{shape['batch']}x{shape['kv_len']}", "config": config, "status": status,
           "seconds": round(seconds, 1), "held_before_gib": round(held / GIB, 2),
           "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / GIB, 2),
           "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 2),
           "device_used_peak_gib": round(peak_used[0] / GIB, 2),
           "device_used_before_gib": round((total - free0) / GIB, 2)}  # fmt: skip
    if trace:
        row["largest"] = _largest(torch.cuda.memory._snapshot())
        torch.cuda.memory._record_memory_history(enabled=None)
    release(DEVICE)
    row["left_allocated_gib"] = round((torch.cuda.memory_allocated() - held) / GIB, 2)
    gc.collect()
    release(DEVICE)
    row["left_after_gc_gib"] = round((torch.cuda.memory_allocated() - held) / GIB, 2)
    row["device_used_after_gib"] = round((total - torch.cuda.mem_get_info()[0]) / GIB, 2)
    print(json.dumps({k: v for k, v in row.items() if k != "largest"}), flush=True)
    return row


def _largest(snapshot: dict, n: int = 6) -> list[dict]:
    """The ``n`` largest allocations in a memory history, with the frames (ours, torch's) that made them."""
    allocs = [e for trace in snapshot.get("device_traces", []) for e in trace if e.get("action") == "alloc"]
    allocs.sort(key=lambda e: -e["size"])
    seen, picked = set(), []
    for e in allocs:
        frames = [f"{Path(f['filename']).name}:{f['line']}:{f['name']}" for f in e.get("frames", [])
                  if "torch" in f["filename"] or "tunectl" in f["filename"]][:8]  # fmt: skip
        key = (e["size"], tuple(frames))
        if key in seen:
            continue
        seen.add(key)
        picked.append({"gib": round(e["size"] / GIB, 3), "frames": frames})
        if len(picked) == n:
            break
    return picked


if __name__ == "__main__":
    sys.exit(main())
