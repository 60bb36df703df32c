"""Planning a very large grid: the driver's memory and the time until the first items are issued.

For grids of 1e4 to 1e7 items (the cost_model task: ten configs at every point of a batch x kv_len
grid, a spec made here), each size runs in a fresh process that plans the spec and issues a lane's
first items, as ``tunectl submit`` does before it dispatches anything: ``plan(spec)`` (counted, not
made), a ``Search`` over it, and ``draw(lookahead(workers))``. Nothing is measured on a device.

``--old REV`` runs the same step with the eager planning of git revision REV side by side
(``plan(spec)`` making every item, then ``Search(plan).start()`` issuing them all), its two modules
loaded from git; sizes above ``--old-max`` are left out of the old column (they need more time and
memory than the machine has).

Memory is the process's peak resident set (``getrusage`` maxrss) less what it held before planning,
so it counts the plan and the issued items, not the interpreter and the imports.

``--submit N`` runs the whole thing instead: the library ``submit()`` of an N-item grid on a local Ray
instance (one worker per core), stopped once ``--rows`` rows are written; it reports the seconds
until dispatch began and until the first row, and the driver's peak resident set.

    python benchmarks/costs/planning.py --old eb61142
    python benchmarks/costs/planning.py --submit 10000000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SIZES = (10**4, 10**5, 10**6, 10**7)
CONFIGS = 10  # per point: the default and nine per-batch cost models
WORKERS = 8  # the lane's workers, which sets its look-ahead


def spec_text(num_items: int) -> str:
    """A cost_model spec of ``num_items`` items: a batch x kv_len grid, ten configs at each point."""
    points = num_items // CONFIGS
    batches = min(points, 1000)
    kvs = points // batches

    def values(n: int) -> str:
        return "[" + ", ".join(str(i + 1) for i in range(n)) + "]"

    per_batch = ", ".join(f"{0.01 * (i + 1):.2f}" for i in range(CONFIGS - 1))
    return (
        f'name = "plan-{num_items}"\ntask = "cost_model"\n[static]\ncapacity = 1000000000000\n'
        f'[shapes.batch]\nvalues = {values(batches)}\nbucket = "exact"\n'
        f'[shapes.kv_len]\nvalues = {values(kvs)}\nbucket = "exact"\n'
        f"[configs]\nper_batch_ms = [{per_batch}]\n"
    )


def rss_kib() -> int:
    """The process's resident set now, in KiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() // 1024


def old_modules(rev: str) -> tuple[Any, Any]:
    """``tunectl.core.plan`` and ``tunectl.decide.search`` as they were at ``rev``, loaded from git."""

    def load(name: str, path: str, replace: tuple[str, str] = ("", "")) -> Any:
        source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True,
                                text=True).stdout.replace(*replace)  # fmt: skip
        module = types.ModuleType(name)
        sys.modules[name] = module
        exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)
        return module

    old_plan = load("_old_plan", "tunectl/core/plan.py")
    old_search = load("_old_search", "tunectl/decide/search.py",
                      ("from tunectl.core.plan import", "from _old_plan import"))  # fmt: skip
    return old_plan, old_search


def measure(num_items: int, old_rev: str | None) -> dict[str, Any]:
    """Plan a grid of ``num_items`` items and issue its first items; seconds and peak memory growth."""
    from tunectl.core.spec import parse_spec
    from tunectl.orchestrator.feed import lookahead
    from tunectl.tasks.cost_model import CostModel

    spec, task = parse_spec(spec_text(num_items), "plan.toml"), CostModel()
    if old_rev is not None:
        old_plan, old_search = old_modules(old_rev)
    before = rss_kib()
    started = time.perf_counter()
    if old_rev is None:
        from tunectl.core.plan import plan
        from tunectl.decide.search import Search

        made = plan(spec, task)
        planned = made.num_items
        search = Search(made, spec.search)
        search.start(())
        first = search.draw(lookahead(WORKERS))
    else:
        made = old_plan.plan(spec, task)
        planned = len(made.items)
        first = old_search.Search(made, spec.search).start(())
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"items": planned, "issued": len(first), "seconds": seconds, "peak_mib": (peak - before) / 1024}


class _StopAfter:
    """Progress that notes when dispatch began and the first row came, and stops the run at ``rows``."""

    def __init__(self, rows: int) -> None:
        self.rows, self.seen, self.started = rows, 0, time.perf_counter()
        self.times: dict[str, float] = {}

    def start(self, run_id: str, total: int, placement: Any) -> None:
        self.times["dispatch"] = time.perf_counter() - self.started
        self.times["total"] = total

    def record(self, record: Any) -> None:
        self.seen += 1
        self.times.setdefault("first_row", time.perf_counter() - self.started)
        if self.seen >= self.rows:
            raise KeyboardInterrupt("enough rows")

    def compiles(self, built: int, total: int, building: int) -> None:
        pass


def submit_once(num_items: int, rows: int) -> dict[str, Any]:
    """The library ``submit()`` of a ``num_items`` grid on a local Ray instance, stopped after ``rows``."""
    import tempfile

    from tunectl.core.spec import parse_spec
    from tunectl.orchestrator.submit import RunOptions, RunStopped, submit

    measure = "[measure]\nwarmup = 1\nmin_samples = 3\nmax_samples = 3\nmax_seconds = 0.05\n"
    spec = parse_spec(spec_text(num_items) + measure, "plan.toml")
    progress = _StopAfter(rows)
    with tempfile.TemporaryDirectory() as results, contextlib.suppress(RunStopped):
        submit(spec, results, progress=progress, options=RunOptions(compile_ahead=False))
    status = Path("/proc/self/status").read_text()
    peak = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    return {**progress.times, "rows": progress.seen, "driver_peak_mib": peak / 1024}


def run_one(num_items: int, old_rev: str | None) -> dict[str, Any]:
    """``measure`` in a fresh process, so that each size's peak is its own."""
    args = [sys.executable, __file__, "--one", str(num_items), *(["--old", old_rev] if old_rev else [])]
    out = subprocess.run(args, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.splitlines()[-1]))


def table(rows: list[tuple[int, dict[str, Any], dict[str, Any] | None]]) -> str:
    lines = [
        "| items | lazy: to first issue | lazy: peak memory | lazy: issued | eager: to first issue | "
        "eager: peak memory |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n, new, old in rows:
        eager = f"{old['seconds']:.2f} s | {old['peak_mib']:,.0f} MiB" if old else "not run | not run"
        lazy = f"{new['seconds']:.2f} s | {new['peak_mib']:,.1f} MiB | {new['issued']}"
        lines.append(f"| {n:,} | {lazy} | {eager} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", metavar="REV", help="also run the eager planning of this git revision")
    parser.add_argument("--old-max", type=int, default=10**6, help="largest grid the eager planning runs")
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--submit", type=int, metavar="N", help="submit an N-item grid to a local Ray")
    parser.add_argument("--rows", type=int, default=200, help="with --submit: stop after this many rows")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.submit is not None:
        print(json.dumps(submit_once(args.submit, args.rows)))
        return
    if args.one is not None:
        print(json.dumps(measure(args.one, args.old)))
        return
    rows = []
    for n in args.sizes:
        new = run_one(n, None)
        old = run_one(n, args.old) if args.old and n <= args.old_max else None
        rows.append((n, new, old))
        print(f"{n:>10,}: lazy {new}" + (f"; eager {old}" if old else ""), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
