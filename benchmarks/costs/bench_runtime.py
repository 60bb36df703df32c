"""What the serving runtime costs: one lookup, and loading (with verification) a large bundle.

    python benchmarks/costs/bench_runtime.py [--entries 100000] [--rounds 21]

Lookup: the median over rounds of the mean time per call in a loop of calls, next to a plain dict
lookup with a prebuilt key in the same run (the floor any lookup keyed by parameters pays on top of).
Load: ``load_bundle`` of a bundle with ``--entries`` entries, every file checksummed, tables parsed
and indexed; the median of several loads, with the environment check off and on.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tunectl.runtime import Entry, WaveRule, load_bundle  # noqa: E402
from tunectl.store.bundle import TaskTable, build_files, publish_local  # noqa: E402

WINDOW = (-1, -1)  # flash_decode's: no sliding window
DECODE = {"dtype": "float32", "num_q_heads": 8, "num_kv_heads": 2, "head_dim": 64, "page_size": 16}
FLASH = {
    "causal": True,
    "dtype": "bfloat16",
    "head_dim": 128,
    "num_kv_heads": 8,
    "num_q_heads": 32,
    "page_size": 16,
    "sinks": False,
    "softcap": 0.0,
    "window": WINDOW,
}


def per_call_ns(fn: Callable[[], Any], calls: int, rounds: int) -> float:
    """Median over rounds of the mean ns per call, each round a loop of ``calls`` calls."""
    loop = range(calls)
    samples = []
    gc.disable()
    try:
        for _ in range(rounds):
            started = time.perf_counter_ns()
            for _ in loop:
                fn()
            samples.append((time.perf_counter_ns() - started) / calls)
    finally:
        gc.enable()
    return statistics.median(samples)


#: an H200-like split rule: 66 (sequence, split) programs a wave, 64-token blocks, splits 1-64
RULE = WaveRule("num_kv_splits", "batch", "kv_len", 66.0, 64, 1, 64, (4.0, 0.004, 1.5, 0.01))


def small_bundle(root: Path) -> Any:
    """The quickstart's task (5 static parameters, 2 bucketed dimensions) and flash_decode's (9 and 3,
    every entry a split rule)."""
    decode = TaskTable(
        "decode_attention",
        tuple(DECODE),
        {"batch": {"policy": "pow2", "points": [1, 4, 16]}, "kv_len": {"policy": "ceil", "points": [2048]}},
        tuple(
            Entry.from_json(
                {"static": DECODE, "shape": {"batch": b, "kv_len": 2048}, "config": {"num_splits": b}}
            )
            for b in (1, 4, 16)
        ),
    )
    points = list(
        itertools.product((1, 2, 4, 8, 16, 32, 64, 128, 256), (1024, 2048, 4096, 8192, 16384, 32768), (1,))
    )
    static = {**FLASH, "window": list(WINDOW)}
    flash = TaskTable(
        "flash_decode",
        tuple(FLASH),
        {
            "batch": {"policy": "pow2", "points": sorted({p[0] for p in points})},
            "kv_len": {"policy": "ceil", "points": sorted({p[1] for p in points})},
            "q_len": {"policy": "exact", "points": [1]},
        },
        tuple(
            Entry.from_json(
                {
                    "static": static,
                    "shape": {"batch": b, "kv_len": kv, "q_len": q},
                    "config": {"backend": "triton", "num_kv_splits": 1},
                    "rule": RULE.to_json(),  # every flash_decode entry is a rule: its count from the shape
                }
            )
            for b, kv, q in points
        ),
    )
    return load_bundle(publish_local(root, "small", "1", build_files("small", "1", [decode, flash], [], {})))


def noop(task: str, /, **params: Any) -> None:
    """Called exactly as ``lookup`` is: what the call itself costs the caller."""


def lookups(rounds: int) -> list[tuple[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        bundle = small_bundle(Path(tmp))
        fresh = [small_bundle(Path(tmp) / str(i)) for i in range(rounds)]
        stepped = [small_bundle(Path(tmp) / f"s{i}") for i in range(rounds)]
    key = (*DECODE.values(), 4, 2048)
    table = {key: {"num_splits": 4}}
    torch_style = {**DECODE, "dtype": "torch.float32"}
    lookup, calls = bundle.lookup, 20_000
    assert lookup("decode_attention", **DECODE, batch=3, kv_len=1500) == {"num_splits": 4}
    assert lookup("flash_decode", **FLASH, batch=3, kv_len=3000, q_len=1) is not None

    def explicit() -> Any:
        return lookup(
            "decode_attention",
            dtype="float32",
            num_q_heads=8,
            num_kv_heads=2,
            head_dim=64,
            page_size=16,
            batch=3,
            kv_len=1500,
        )

    def new_kv_len_each_call(bundles: list[Any]) -> float:
        """A decode server's pattern: kv_len grows every step, so each call is a key never seen."""
        samples = []
        for b in bundles:
            kv_lens = iter(range(1, calls + 1))
            started = time.perf_counter_ns()
            for _ in range(calls):
                b.lookup("flash_decode", **FLASH, batch=3, kv_len=next(kv_lens), q_len=1)
            samples.append((time.perf_counter_ns() - started) / calls)
        return statistics.median(samples)

    def steps_of_layers(bundles: list[Any], layers: int = 32) -> float:
        """A serving step as a model takes it: a new kv_len, then the same shape at every layer."""
        samples = []
        for b in bundles:
            steps = calls // layers
            started = time.perf_counter_ns()
            for kv_len in range(1, steps + 1):
                for _ in range(layers):
                    b.lookup("flash_decode", **FLASH, batch=3, kv_len=kv_len, q_len=1)
            samples.append((time.perf_counter_ns() - started) / (steps * layers))
        return statistics.median(samples)

    return [
        ("plain dict: `table.get(key)`, key prebuilt", per_call_ns(lambda: table.get(key), calls, rounds)),
        (
            "call overhead alone: `noop(task, **static, batch=3, kv_len=1500)`",
            per_call_ns(lambda: noop("decode_attention", **DECODE, batch=3, kv_len=1500), calls, rounds),
        ),
        (
            "lookup decode_attention (5 static, pow2 + ceil), hit, `**static`",
            per_call_ns(lambda: lookup("decode_attention", **DECODE, batch=3, kv_len=1500), calls, rounds),
        ),
        ("lookup decode_attention, hit, every parameter spelled out", per_call_ns(explicit, calls, rounds)),
        (
            "lookup decode_attention, miss (batch 64 not tuned)",
            per_call_ns(lambda: lookup("decode_attention", **DECODE, batch=64, kv_len=1500), calls, rounds),
        ),
        (
            "lookup decode_attention, dtype given as 'torch.float32' (normalised)",
            per_call_ns(
                lambda: lookup("decode_attention", **torch_style, batch=3, kv_len=1500), calls, rounds
            ),
        ),
        (
            "call overhead alone, flash_decode's 12 parameters",
            per_call_ns(lambda: noop("flash_decode", **FLASH, batch=3, kv_len=3000, q_len=1), calls, rounds),
        ),
        (
            "lookup flash_decode (9 static, pow2 + ceil + exact; rule entries), hit",
            per_call_ns(
                lambda: lookup("flash_decode", **FLASH, batch=3, kv_len=3000, q_len=1), calls, rounds
            ),
        ),
        (
            "lookup flash_decode, a new kv_len every call (first sight of each key, the rule evaluated)",
            new_kv_len_each_call(fresh),
        ),
        (
            "the same with picks confirmed by part at 32 batch sizes (21 KV parts each, a pick in every one)",
            new_kv_len_each_call([confirmed_by_part(b) for b in fresh]),
        ),
        (
            "lookup flash_decode per call over decode steps of 32 layers (a new kv_len each step)",
            steps_of_layers(stepped),
        ),
    ]


def confirmed_by_part(bundle: Any) -> Any:
    """``bundle`` with flash_decode picks confirmed by part (``tunectl.measure.parts``): every part of
    every KV cell (cut to 2x, then in 4) at batch sizes 1-32, as a serving process's confirming may
    leave it."""
    from tunectl.core.buckets import cell_middle, refined, split_cells

    parts = split_cells("ceil", refined("ceil", [1024, 2048, 4096, 8192, 16384, 32768]), 4)
    picks = [
        ({**FLASH, "batch": b, "q_len": 1, "kv_len": cell_middle("ceil", parts, p)}, {"backend": "fa4"})
        for b in range(1, 33)
        for p in parts
    ]
    return bundle.with_confirmed("flash_decode", picks, by_cell={"kv_len": parts})


def big_table(num_entries: int) -> TaskTable:
    """``num_entries`` entries: 100 static keys x batch x kv_len, with the statistics export writes."""
    batches = [1 << i for i in range(10)]
    kv_lens = [1024 * (i + 1) for i in range(max(1, num_entries // (100 * len(batches))))]
    statics = [
        {**DECODE, "num_q_heads": 8 * (1 + i % 10), "head_dim": 64 * (1 + i // 10)} for i in range(100)
    ]
    entries: list[Entry] = []
    for i, (static, b, kv) in enumerate(itertools.product(statics, batches, kv_lens)):
        if len(entries) == num_entries:
            break
        entries.append(
            Entry.from_json(
                {
                    "static": static,
                    "shape": {"batch": b, "kv_len": kv},
                    "config": {
                        "num_splits": 1 << (i % 6),
                        "gqa": ("expand", "grouped")[i % 2],
                        "gather": "index",
                    },
                    "is_default": i % 6 == 0,
                    "median_us": 100.0 + i * 0.37,
                    "p20_us": 99.0 + i * 0.37,
                    "p80_us": 101.5 + i * 0.37,
                    "rel_noise": 0.0125,
                    "num_samples": 40 + i % 17,
                    "default_median_us": 180.25 + i * 0.5,
                    "speedup": 1.8 - (i % 9) * 0.01,
                    "run_id": "r20261129-221300-3fa2c1",
                }
            )
        )
    shapes = {"batch": {"policy": "pow2", "points": batches}, "kv_len": {"policy": "ceil", "points": kv_lens}}
    return TaskTable("decode_attention", tuple(DECODE), shapes, tuple(entries))


def loads(num_entries: int, repeats: int) -> tuple[dict[str, int], list[tuple[str, float]]]:
    table = big_table(num_entries)
    assert len(table.entries) == num_entries, len(table.entries)
    env = {
        "device_kind": "cuda",
        "device_name": "NVIDIA H200",
        "compute_capability": "9.0",
        "packages": {"torch": "2.11.0+cu130", "triton": "3.6.0"},
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = publish_local(tmp, "big", "1", build_files("big", "1", [table], ["r1"], env))
        sizes = {
            p.relative_to(path).as_posix(): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()
        }
        here = {
            "device_name": "H200",
            "compute_capability": "9.0",
            "packages": {"torch": "2.11.0", "triton": "3.6.0"},
        }

        def timed(**kwargs: Any) -> float:
            samples = []
            load_bundle(path, **kwargs)  # warm: the OS page cache, imports
            for _ in range(repeats):
                gc.collect()
                started = time.perf_counter()
                bundle = load_bundle(path, **kwargs)
                samples.append((time.perf_counter() - started) * 1e3)
                assert len(bundle) == num_entries
                del bundle
            return statistics.median(samples)

        def first_entry() -> float:
            bundle = load_bundle(path, env_policy="off")
            started = time.perf_counter()
            bundle.entry("decode_attention", **DECODE, batch=1, kv_len=1)
            return (time.perf_counter() - started) * 1e3

        results = [
            ("load + verify, env_policy='off'", timed(env_policy="off")),
            (
                "load + verify, env_policy='strict', environment given",
                timed(env_policy="strict", environment=here),
            ),
            (
                "load + verify, env_policy='warn', environment found (procfs, installed versions)",
                timed(env_policy="warn"),
            ),
            ("first `entry()` afterwards (parses the statistics once)", first_entry()),
        ]
    return sizes, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--loads", type=int, default=9)
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {platform.processor() or 'cpu'}")
    print(f"\nlookup cost per call (median of {args.rounds} rounds of 20,000 calls)")
    for name, ns in lookups(args.rounds):
        print(f"  {ns:8.0f} ns  {name}")
    sizes, results = loads(args.entries, args.loads)
    print(
        f"\nbundle of {args.entries:,} entries: "
        + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sizes.items())
    )
    for name, ms in results:
        print(f"  {ms:8.1f} ms  {name}")


if __name__ == "__main__":
    main()
