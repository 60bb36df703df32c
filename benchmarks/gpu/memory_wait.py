"""How long a worker takes to answer a look whose kernel cannot fit in device memory.

The decode spec's SDPA config that expands K and V over the query heads needs 16 GiB for each at
batch 64 x 32768; on an 80 GB H100 beside the worker's own holdings it ran out of memory, and the
worker waited up to 60 s for memory no other process held (throughput.md, sixteenth session). This
script makes the same case in one process, with no Ray and no compile processes: a measuring runner
on the GPU at that point, one config timed there first (its sampler kept), then the expanding SDPA
config while this process holds memory so that only ``--leave-gib`` GiB are free (at 8 it cannot
fit; at 24 it does on an H100). It prints, per look, the status, the seconds the look took and the
first line of its message. From the project root, after ``pip install --no-deps -e .`` (the tasks
are found by their entry points), under each tree to compare:

    PYTHONPATH=OLD_TREE python benchmarks/gpu/memory_wait.py --leave-gib 8
    PYTHONPATH=$PWD python benchmarks/gpu/memory_wait.py --leave-gib 8

No staging needed (torch alone).

``--others-for S``: another process holds the memory instead (a compile process keeping a point's
inputs), and lets it go S seconds after the look begins; the look waits for it. The seconds the look
took, less S, are what the wait cost beyond the memory's own release. On an H100 the expanding config
does not fit even then (its retry takes 65 GiB and asks 16 GiB more), so the look ends in an error in
every tree, and its seconds say when each tree tried again and gave up (throughput.md, eighteenth
session):

    PYTHONPATH=OLD_TREE python benchmarks/gpu/memory_wait.py --leave-gib 8 --others-for 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Mapping

import torch

from tunectl.core.keys import key_dict, make_key
from tunectl.core.plan import WorkItem, plan
from tunectl.core.spec import MeasureSpec, load_spec
from tunectl.measure.runner import ItemRunner

SPEC = "configs/h200/flash_decode.toml"
POINT = {"page_size": 16, "batch": 64, "kv_len": 32768}  # the decode spec's point, page 16
FIRST = {"backend": "sdpa", "sdpa_backend": "cudnn", "sdpa_gqa": "native"}
EXPANDING = {"backend": "sdpa", "sdpa_backend": "cudnn", "sdpa_gqa": "expand"}
#: another process: holds argv[1] bytes on the GPU, says so, lets go argv[2] seconds after it reads a line
HOLDER = """
import sys, time, torch
held = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("held", flush=True)
sys.stdin.readline()
time.sleep(float(sys.argv[2]))
"""


def at_point() -> WorkItem:
    """An item of the shipped decode spec at ``POINT`` (its static key and shape)."""
    for item in plan(load_spec(SPEC)).work_items():
        params = {**key_dict(item.static), **key_dict(item.shape)}
        if all(params[name] == value for name, value in POINT.items()):
            return item
    raise SystemExit(f"{SPEC} plans no item at {POINT}")


def look(runner: ItemRunner, item: WorkItem, name: str, config: Mapping[str, object]) -> dict[str, object]:
    item = dataclasses.replace(item, item_id=name, config=make_key(config), is_default=False)
    started = time.perf_counter()
    [record] = runner.run("memory-wait", item, MeasureSpec(max_seconds=0.5))
    return {
        "config": config,
        "status": str(record.status.value),
        "seconds": round(time.perf_counter() - started, 2),
        "median_us": record.median_us,
        "message": (record.message.splitlines() or [""])[0][:240],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--leave-gib", type=float, default=24.0, help="memory left free after holding (GiB)")
    p.add_argument("--others-for", type=float, default=0.0, help="another process holds it for S seconds")
    args = p.parse_args()
    import tunectl

    item, runner = at_point(), ItemRunner("cuda:0")
    looks: list[dict[str, object]] = []
    out: dict[str, object] = {
        "tree": tunectl.__file__,
        "device": torch.cuda.get_device_name(0),
        "looks": looks,
    }
    looks.append(look(runner, item, "first", FIRST))  # the point's inputs built, a sampler kept
    free, _ = torch.cuda.mem_get_info()
    hold = max(0, int(free - args.leave_gib * 2**30))
    out["held_gib"] = round(hold / 2**30, 2)
    if not args.others_for:
        held = torch.empty(hold, dtype=torch.uint8, device="cuda:0")  # noqa: F841  (held while it looks)
        looks.append(look(runner, item, "expanding", EXPANDING))
        print(json.dumps(out, indent=1))
        return
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(max(0, hold - 2**30)), str(args.others_for)],  # its context
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdout.readline()
    holder.stdin.write("go\n")
    holder.stdin.flush()  # it lets go ``others_for`` seconds from now
    out["others_for_s"] = args.others_for
    looks.append(look(runner, item, "expanding", EXPANDING))
    holder.wait()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
