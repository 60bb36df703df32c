"""Does a FlexAttention decode kernel run at another speed loaded from its ahead-of-time package than
compiled in-process? The same ``flash_decode`` flex configs at the same points, prepared both ways in one
process, checked and timed side by side.

Two ways to a flex kernel:

- ``package``: a tuning worker's, where a compile cache is set (``TUNECTL_COMPILE_CACHE``). The kernel
  is built into a package as a compile process builds it (``tunectl.tasks.compile.build``, which calls
  the task's ``build_ahead``: Dynamo capture, Inductor standalone compile, the package's check), then
  ``task.prepare`` loads it (``tunectl.tasks._flex.packaged``);
- ``compile``: a process outside a run's, with no compile cache (start-up confirming, a serving
  process): ``task.prepare`` finds no package and compiles ``flex_attention`` with torch.compile.

Per point (the decode static of ``configs/h200/flash_decode.toml`` at a page size; a batch and kv_len;
q_len 1) and flex config of that spec, both calls are checked against the task's reference
(``compare_outputs`` within ``task.tolerance``) and against each other (bitwise), timed with the
tuner's sampler (``cuda_difference_sampler(fn, device, "graph")``: cold L2, CUDA graphs) in
``--rounds`` rounds, the path that goes first alternating, each round the median of
``--samples`` samples. A row gives each path's median of its round medians, the median of the
per-round ratios package / compile (with their range), whether the outputs are equal bit for bit, and
which way each call was prepared (``aot_loads``: ``loaded`` for the package path, ``absent`` for the
compile path). After the timing, each call's kernels are listed with ``torch.profiler`` (name, grid,
block, registers, shared memory; launches and device µs per call, warm L2); where the two paths' differ,
they are printed under the table.

    source /tmp/tunectl-site/env.sh && PYTHONPATH=.:$PYTHONPATH python benchmarks/gpu/flex_paths.py \\
        --out $OUT/flex_paths.json
    python benchmarks/gpu/flex_paths.py --device cpu --points 16:1:64 --configs 0 --rounds 2 --samples 3

``--points`` takes ``page:batch:kv_len`` items, comma-separated, or ``all`` (``ALL_POINTS``);
``--configs`` the indices of the spec's flex configs (default: all); no (point, config) is begun after
``--budget-s`` seconds (its row says it was skipped). The CPU run is a check of the
plumbing only (flex compiled for the CPU, timed by the host clock), not a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
SPEC = ROOT / "configs" / "h200" / "flash_decode.toml"
#: (page_size, batch, kv_len) of every point this can time (``--points all``); q_len is 1
ALL_POINTS = tuple((p, b, n) for p in (128, 16) for b in (1, 2) for n in (2817, 16768, 1984))
DEFAULT_POINTS = "128:1:2817,128:2:16768,16:2:1984"
PATHS = ("package", "compile")

Call = Callable[[], Any]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="A flex decode kernel loaded from its package against the same compiled in-process."
    )
    parser.add_argument("--spec", default=str(SPEC), help="the spec giving the static and flex configs")
    parser.add_argument("--points", default=DEFAULT_POINTS, help="page:batch:kv_len,... or all")
    parser.add_argument("--configs", default="", help="indices of the spec's flex configs (default all)")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds per (point, config)")
    parser.add_argument("--samples", type=int, default=30, help="samples per path per round")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--budget-s", type=float, default=120.0, help="begin no (point, config) after this")
    parser.add_argument("--out", default=None, help="write the results here as JSON")
    return parser.parse_args(argv)


def parse_points(text: str) -> list[tuple[int, int, int]]:
    """``page:batch:kv_len`` items, comma-separated, or ``all``."""
    if text.strip() == "all":
        return list(ALL_POINTS)
    points = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise SystemExit(f"--points: {item!r} is not page:batch:kv_len")
        points.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return points


def decode_static(spec_path: str, page_size: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The spec's static key at ``page_size`` and its flex configs, as the tuner plans them."""
    from tunectl.core.keys import key_dict
    from tunectl.core.plan import plan
    from tunectl.core.spec import load_spec

    for static, configs in plan(load_spec(spec_path)).configs:
        if key_dict(static)["page_size"] == page_size:
            flex = [key_dict(c) for c in configs if key_dict(c).get("backend") == "flex"]
            return key_dict(static), flex
    raise SystemExit(f"{spec_path} has no static key with page_size {page_size}")


@contextlib.contextmanager
def compile_cache(root: Path | None) -> Iterator[None]:
    """The process as a worker in a run sees it (``TUNECTL_COMPILE_CACHE`` = ``root``), or as a process
    outside one (unset); ``TUNECTL_FLEX_AOT`` unset either way (packages on by default)."""
    from tunectl.tasks._flex import AOT_ENV
    from tunectl.tasks.compile import CACHE_ENV

    saved = {name: os.environ.pop(name, None) for name in (CACHE_ENV, AOT_ENV)}
    if root is not None:
        os.environ[CACHE_ENV] = str(root)
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def first_call(
    task: Any, item: tuple[Any, ...], inputs: dict[str, Any], device: str
) -> tuple[Call, Any, dict[str, Any]]:
    """``task.prepare`` and its first call (where a lazily built flex call compiles or loads): the call,
    its output, the seconds the first call took and how the call got its kernel (``aot_loads``)."""
    from tunectl.tasks import _flex
    from tunectl.tasks.compile import synchronize

    static, shape, config = item
    before = Counter(_flex.aot_loads)
    fn = task.prepare(dict(static), dict(shape), dict(config), inputs)
    started = time.perf_counter()
    out = fn()
    synchronize(device)
    seconds = time.perf_counter() - started
    return fn, out, {"first_call_s": seconds, "aot_loads": dict(_flex.aot_loads - before)}


def prepare_package(task: Any, item: tuple[Any, ...], inputs: dict[str, Any], device: str, root: Path) -> Any:
    """The package path: built as a compile process builds it, then loaded by ``prepare``."""
    from tunectl.tasks import _flex_packages
    from tunectl.tasks.compile import build, compile_key

    static, shape, config = item
    with compile_cache(root):
        built_s = build(task, static, shape, config, device, lambda _static, _shape: inputs)
        key = task.compile_key(dict(static), dict(shape), dict(config))
        path = _flex_packages.aot_package(task.name, key, device)
        fn, out, info = first_call(task, item, inputs, device)
    info.update(build_s=built_s, package=str(path) if path and path.is_file() else None)
    info["compile_key"] = compile_key(task, static, shape, config)
    return fn, out, info


def prepare_compiled(task: Any, item: tuple[Any, ...], inputs: dict[str, Any], device: str) -> Any:
    """The compile path: no compile cache, so ``prepare`` compiles with torch.compile."""
    with compile_cache(None):
        return first_call(task, item, inputs, device)


def kernels(fn: Call, device: str, calls: int = 5) -> dict[str, dict[str, float]]:
    """What one call runs, by ``torch.profiler``: per kernel (its name, grid, block, registers and
    shared memory; memsets and copies included), its launches and device µs per call (warm L2). On a
    CPU: the host's ops, for the plumbing only."""
    from torch.profiler import ProfilerActivity, profile

    from tunectl.tasks.compile import synchronize

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    fn()
    synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        synchronize(device)
    with tempfile.TemporaryDirectory(prefix="flex-paths-trace-") as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    kinds = ("kernel", "gpu_memset", "gpu_memcpy") if cuda else ("cpu_op",)
    count: Counter[str] = Counter()
    total_us: dict[str, float] = {}
    for event in events:
        if event.get("ph") == "X" and event.get("cat") in kinds:
            key = kernel_key(event)
            count[key] += 1
            total_us[key] = total_us.get(key, 0.0) + float(event.get("dur", 0.0))
    return {k: {"per_call": count[k] / calls, "us": total_us[k] / calls} for k in sorted(count)}


def kernel_key(event: Mapping[str, Any]) -> str:
    """A trace event's kernel: its name and, where the trace gives them, its launch's shape."""
    args = event.get("args", {})
    shown = (
        ("grid", "grid"),
        ("block", "block"),
        ("registers per thread", "regs"),
        ("shared memory", "smem"),
    )
    parts = [f"{label}={args[name]}" for name, label in shown if name in args]
    return " ".join([str(event.get("name")), *parts])


def sampler_for(fn: Call, device: str) -> Any:
    """The tuner's sampler for a decode call on a GPU (cold L2, difference method, CUDA graphs); the
    host clock on a CPU."""
    if device.startswith("cuda"):
        from tunectl.measure.difference import cuda_difference_sampler

        return cuda_difference_sampler(fn, device, "graph")
    from tunectl.measure.timing import make_sampler

    return make_sampler(fn, device, "eager", "warm")


def time_paths(fns: Mapping[str, Call], device: str, rounds: int, samples: int) -> dict[str, list[float]]:
    """Per path, each round's median of ``samples`` samples; the path that goes first alternates."""
    from tunectl.core.spec import MeasureSpec
    from tunectl.measure.harness import measure

    settings = MeasureSpec(
        warmup=2, min_samples=samples, max_samples=samples, noise_target=0.01, max_seconds=60.0
    )
    samplers = {name: sampler_for(fn, device) for name, fn in fns.items()}
    medians: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            medians[name].append(measure(samplers[name], settings).median_us)
    return medians


def summary(medians: Mapping[str, list[float]]) -> dict[str, Any]:
    """Each path's median of round medians, and the per-round ratios package / compile."""
    ratios = [p / c for p, c in zip(medians["package"], medians["compile"], strict=True)]
    return {
        "package_us": statistics.median(medians["package"]),
        "compile_us": statistics.median(medians["compile"]),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "round_medians_us": dict(medians),
    }


def compare_pair(
    task: Any, item: tuple[Any, ...], inputs: dict[str, Any], ref: Any, device: str, root: Path, args: Any
) -> dict[str, Any]:
    """One (point, config): both paths prepared, checked, listed and timed (module doc)."""
    import torch

    from tunectl.tasks.base import compare_outputs

    fns: dict[str, Call] = {}
    outs: dict[str, Any] = {}
    info: dict[str, dict[str, Any]] = {}
    fns["package"], outs["package"], info["package"] = prepare_package(task, item, inputs, device, root)
    fns["compile"], outs["compile"], info["compile"] = prepare_compiled(task, item, inputs, device)
    atol, rtol = task.tolerance(item[0])
    for name in PATHS:
        err, ok = compare_outputs(outs[name], ref, atol, rtol)
        info[name].update(max_abs_err=err, matches_reference=ok)
    equal = bool(torch.equal(outs["package"], outs["compile"]))
    medians = time_paths(fns, device, args.rounds, args.samples)
    for name in PATHS:  # after the timing: the profiler's start-up stays out of it
        info[name]["kernels"] = kernels(fns[name], device)
    return {"bitwise_equal": equal, **summary(medians), "paths": info}


def run_point(
    task: Any, point: tuple[int, int, int], config_ids: list[int] | None, root: Path, args: Any
) -> list[dict[str, Any]]:
    """Every chosen flex config at one point, on one set of inputs; a row each (those not begun by
    ``args.deadline`` skipped)."""
    from tunectl.tasks._flex_packages import why

    page, batch, kv_len = point
    static, configs = decode_static(args.spec, page)
    shape = {"batch": batch, "kv_len": kv_len, "q_len": 1}
    chosen = [c for i, c in enumerate(configs) if config_ids is None or i in config_ids]
    made: list[Any] = []  # the inputs and the reference, made for the first config begun
    rows = []
    for config in chosen:
        row: dict[str, Any] = {"page_size": page, **shape, "config": config}
        if time.perf_counter() > args.deadline:
            row["skipped"] = f"past --budget-s {args.budget_s:g}"
        else:
            try:
                if not made:
                    inputs = task.build_inputs(static, shape, args.device)
                    made += [inputs, task.reference(static, shape, inputs)]
                item = (static, shape, config)
                row.update(compare_pair(task, item, made[0], made[1], args.device, root, args))
            except Exception as exc:
                row["error"] = why(exc)
        print(line(row), flush=True)
        rows.append(row)
    return rows


def config_label(config: Mapping[str, Any]) -> str:
    rest = " ".join(f"{k}={v}" for k, v in sorted(config.items()) if k != "backend")
    return f"{config.get('backend')} {rest}".strip()


HEADER = (
    f"{'page':>4} {'batch':>5} {'kv_len':>6}  {'config':<28} {'package':>9} {'compile':>9} "
    f"{'pkg/cmp':>7} {'range':>13}  {'bitwise':<7} {'ref p/c':<7} {'via p/c':<15} launches p/c"
)


def line(row: Mapping[str, Any]) -> str:
    """One row of the table: µs each way, package / compile, and what tells the two calls apart."""
    head = f"{row['page_size']:>4} {row['batch']:>5} {row['kv_len']:>6}  {config_label(row['config']):<28}"
    if "error" in row or "skipped" in row:
        return f"{head} {'error: ' + row['error'] if 'error' in row else 'skipped: ' + row['skipped']}"
    p, c = row["paths"]["package"], row["paths"]["compile"]
    via = "/".join(",".join(sorted(x["aot_loads"])) or "-" for x in (p, c))
    refs = "/".join("ok" if x["matches_reference"] else "BAD" for x in (p, c))
    counts = "/".join(f"{sum(k['per_call'] for k in x['kernels'].values()):g}" for x in (p, c))
    same = "same kernels" if set(p["kernels"]) == set(c["kernels"]) else "kernels differ"
    return (
        f"{head} {row['package_us']:>9.2f} {row['compile_us']:>9.2f} {row['ratio']:>7.3f} "
        f"{row['ratio_min']:>6.3f}-{row['ratio_max']:<6.3f}  {'yes' if row['bitwise_equal'] else 'no':<7} "
        f"{refs:<7} {via:<15} {counts} ({same})"
    )


def kernel_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Each row's kernels per path, where the two paths' kernels (names, launch shapes) differ."""
    out = []
    for row in rows:
        if "paths" not in row:
            continue
        package, compiled = (row["paths"][name]["kernels"] for name in PATHS)
        if set(package) == set(compiled):
            continue
        out.append(f"{row['page_size']}:{row['batch']}:{row['kv_len']} {config_label(row['config'])}")
        for name in PATHS:
            for kernel, k in row["paths"][name]["kernels"].items():
                out.append(f"    {name:<8} {k['per_call']:>4g} x {k['us']:>8.2f} us  {kernel[:160]}")
    return out


def environment(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None
    return {
        "device": args.device,
        "gpu": gpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "spec": args.spec,
        "rounds": args.rounds,
        "samples": args.samples,
        "budget_s": args.budget_s,
        "sampler": "cuda_difference_sampler(fn, device, 'graph')" if gpu else "cpu_sampler (plumbing only)",
    }


def write(path: str | None, results: Mapping[str, Any]) -> None:
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(results, indent=1, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tunectl.tasks.registry import get_task

    task = get_task("flash_decode")
    points = parse_points(args.points)
    config_ids = [int(i) for i in args.configs.split(",")] if args.configs.strip() else None
    results: dict[str, Any] = {**environment(args), "points": points, "rows": [], "seconds": 0.0}
    started = time.perf_counter()
    args.deadline = started + args.budget_s
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="flex-paths-") as tmp:
        for point in points:
            results["rows"] += run_point(task, point, config_ids, Path(tmp) / "tunectl", args)
            results["seconds"] = time.perf_counter() - started
            write(args.out, results)
    for text in kernel_lines(results["rows"]):
        print(text)
    skipped = sum("skipped" in row for row in results["rows"])
    print(f"{len(results['rows'])} rows ({skipped} skipped) in {results['seconds']:.0f} s")
    return 1 if any("error" in row for row in results["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
