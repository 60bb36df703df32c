"""A model of a sweep on a fleet: workers that compile for themselves (before) against compile processes
per node that build each kernel once, ahead, while workers only load (now).

It is fed with what a real sweep recorded on one H200 (``benchmarks/costs/fleet.py sweeps``): per item its
kernel (compile key), the seconds its worker spent preparing it (``load_s``: with the kernel built,
loading it and capturing its graph) and measuring it (``run_s``); per kernel the seconds a compile
process took to build it (``build_s``). Assumptions, stated:

- The workload is the recorded sweep repeated ``copies`` times with kernels of their own (as if for
  more static keys), so that every GPU has about ``items_per_gpu`` items.
- Before: a worker pays ``build_s`` of a kernel the first time it needs it (nothing is shared between
  worker processes: flash-attn-4 kept its kernels in memory) and ``load_s`` after that, plus once its
  libraries' first-call start-up (``BEFORE_INIT_S``: the first-call outliers of the rows recorded on
  2026-11-29, flash-attn-4 ~11 s and Inductor ~5 s per process); it always has work.
- Now: each node has ``builders_per_gpu`` compile processes per GPU (compile capacity grows with the
  node's cores, as the default count does) that build the kernels its queue needs, in queue order,
  node k of M every M-th kernel first, each kernel once per node (once per cluster with a shared cache);
  a worker takes the first of the next ``window`` items whose kernel is built on its node, else waits
  for the next build there; it pays ``load_s``. Builders' own start-up is in their first builds.
- Workers take their first item ``WORKER_START_S`` after the run starts (a process, torch, a CUDA
  context, the libraries: 10-15 s on the H200 host), in both designs; compile processes start at
  once and their own start-up is in their first builds.
- Items are independent; dispatch costs nothing (measured: ~1 ms per item, benchmarks/results).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Item:
    kernel: str | None
    load_s: float
    run_s: float


def workload(run: dict[str, Any], copies: int) -> tuple[list[Item], dict[str, float]]:
    """The recorded items repeated ``copies`` times, each copy with kernels of its own."""
    base_items = run["per_item"]
    builds = {k: float(v) for k, v in run["per_kernel_build_s"].items()}
    typical = sorted(builds.values())[len(builds) // 2] if builds else 0.0
    items, kernels = [], {}
    for c in range(copies):
        for rec in base_items:
            kernel = rec["kernel"]
            name = None if kernel is None else f"{c}:{kernel}"
            if name is not None:
                kernels[name] = builds.get(kernel, typical)  # not built ahead: a typical build
            items.append(Item(name, float(rec["load_s"]), max(0.0, float(rec["run_s"]))))
    return items, kernels


WORKER_START_S = 10.0
#: seconds of library start-up on a worker's first call, per grid (see module doc)
BEFORE_INIT_S = {"decode": 16.0, "prefill": 5.0}


def simulate_before(items: list[Item], kernels: dict[str, float], gpus: int, init_s: float = 0.0) -> float:
    """Span with workers that compile what they need themselves."""
    free = [(WORKER_START_S + init_s, w) for w in range(gpus)]
    compiled: list[set[str]] = [set() for _ in range(gpus)]
    span = 0.0
    for item in items:
        t, w = heapq.heappop(free)
        cost = item.run_s + item.load_s
        if item.kernel is not None and item.kernel not in compiled[w]:
            compiled[w].add(item.kernel)
            cost += kernels[item.kernel]
        t += cost
        span = max(span, t)
        heapq.heappush(free, (t, w))
    return span


def simulate_now(items: list[Item], kernels: dict[str, float], gpus: int, nodes: int, builders: int,
                 shared: bool = False, window: int = 256) -> float:  # fmt: skip
    """Span with ``builders`` compile processes per node building ahead (see module doc)."""
    per_node = math.ceil(gpus / nodes)
    scopes = 1 if shared else nodes
    order = list(dict.fromkeys(i.kernel for i in items if i.kernel is not None))
    built_at: list[dict[str, float]] = [{} for _ in range(scopes)]
    for scope in range(scopes):  # each node's builders build every scopes-th kernel first, then the rest
        queue = order[scope::scopes] + [k for i, k in enumerate(order) if i % scopes != scope]
        slots = [0.0] * (builders * (nodes if shared else 1))  # ``builders``: per node
        heapq.heapify(slots)
        for kernel in queue:
            t = heapq.heappop(slots) + kernels[kernel]
            built_at[scope][kernel] = t
            heapq.heappush(slots, t)
    # Builds of kernels taken elsewhere first are wasted work, not time on the GPU: ignored here.
    pending = list(range(len(items)))
    free = [(WORKER_START_S, w) for w in range(gpus)]
    span = 0.0
    while pending:
        t, w = heapq.heappop(free)
        scope = 0 if shared else w // per_node
        ready = built_at[scope]
        pick, start = None, math.inf
        for pos, idx in enumerate(pending[:window]):
            needs = items[idx].kernel
            at = 0.0 if needs is None else ready.get(needs, math.inf)
            if at <= t:
                pick, start = pos, t
                break
            if at < start:
                pick, start = pos, at
        assert pick is not None
        if start > t:  # nothing built for this node yet: wait for its next build, or for others to move
            later = [f for f, _ in free if f > t]  # when another worker next takes (or finishes) an item
            heapq.heappush(free, (min([start, *later]), w))
            continue
        item = items[pending.pop(pick)]
        end = start + item.load_s + item.run_s
        span = max(span, end)
        heapq.heappush(free, (end, w))
    return span


def simulate_table(runs: list[dict[str, Any]], builders_per_gpu: int = 4, items_per_gpu: int = 60) -> str:
    """Speedup over one GPU, before and now, for 8, 32 and 128 GPUs over 1-16 nodes, and the span of
    each design at N GPUs (now against before)."""
    lines = [
        "| grid | GPUs | nodes | before: speedup | before: x N | now: speedup | now: x N | "
        "now, shared cache: x N | span now / before |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        if run["gpus"] != 1 or run["caches"] != "cold":
            continue
        init_s = BEFORE_INIT_S.get(run["grid"], 0.0)
        for gpus, nodes in ((8, 1), (8, 8), (32, 4), (32, 16), (128, 16)):
            per_node = builders_per_gpu * math.ceil(gpus / nodes)
            copies = max(1, math.ceil(gpus * items_per_gpu / len(run["per_item"])))
            items, kernels = workload(run, copies)
            one_before = simulate_before(items, kernels, 1, init_s)
            one_now = simulate_now(items, kernels, 1, 1, builders_per_gpu)
            span_before = simulate_before(items, kernels, gpus, init_s)
            span_now = simulate_now(items, kernels, gpus, nodes, per_node)
            shared = one_now / simulate_now(items, kernels, gpus, nodes, per_node, shared=True)
            before, now = one_before / span_before, one_now / span_now
            lines.append(
                f"| {run['grid']} | {gpus} | {nodes} | {before:.1f}x | {before / gpus:.2f} | "
                f"{now:.1f}x | {now / gpus:.2f} | {shared / gpus:.2f} | {span_now / span_before:.2f} |"
            )
    return "\n".join(lines)
