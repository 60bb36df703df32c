"""The driver's bookkeeping, with fake workers (no Ray, no device): how many finished items a second
one driver takes back and answers with the next ones.

The work is the real thing, built as ``tunectl submit`` builds a lane's: a ``Search`` over a planned
spec, ``Refined`` over it and ``Probed`` over both. The spec (``SPEC``) is decode-like: four static
keys, 367 starting points (a batch x kv_len grid, the points over a static key's capacity skipped),
50 configs, successive halving, finals, 16 refined points per static key, two probes per cell.

The fleet is played as the dispatcher plays it (``tunectl/orchestrator/dispatch.py`` and ``feed.py``):
the lane's queue (its ``WorkQueue``) topped up by ``draw`` to a look-ahead of 16 items per worker
before each item is handed out, two calls in flight per worker, a worker staying on its point while
the point has items, and each finished item's records fed back through ``follow_up``. The records are
the ones the tests fabricate (``tests/unit/test_refine.py``'s ``answer``, of the tree measured: the
cost model's true time, so the winners change over the grid and refinement, finals and probes really
happen). A worker's items finish in virtual time by their length (a screening look its budget, a
comparison its rounds times its arms), so records come back interleaved as a fleet's do.

Timed: the work's calls as the dispatcher and ``submit`` make them (``draw``, ``follow_up``, and
``estimate`` and ``missing`` at the start and the end). Not timed: the fake fleet, the queue and the
records' making. Items/s is finished items over the CPU seconds of those calls (what a driver on a
core of its own would do; on a shared machine the clock also counts other processes), and by the
clock. ``order`` is a digest of every item handed out, in order: two trees with the same digest made
the same decisions.

``--tree PATH`` imports tunectl from another source tree (an older checkout, ``git worktree add
/tmp/old REV``) with the same fake fleet. ``--compare PATH`` runs that tree and this one side by side,
each worker count in a fresh process of each, and writes ``benchmarks/results/driver_throughput.json``.
``--limit-s S`` stops a fleet once the work's calls took S seconds (``complete`` false): a driver
whose every record walks the grid takes tens of minutes over this one.

    python benchmarks/costs/driver_throughput.py                      # this tree
    python benchmarks/costs/driver_throughput.py --tree /tmp/old      # the older tree
    python benchmarks/costs/driver_throughput.py --compare /tmp/old --limit-s 300   # both, and the results
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import itertools
import json
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # tunectl is imported where it runs: from the tree ``--tree`` names
    from tunectl.core.plan import WorkItem
    from tunectl.core.record import Record

ROOT = Path(__file__).resolve().parents[2]
WORKERS = (1, 8, 32, 128)
PREFETCH = 2  # calls in flight per worker (the spec's [resources] prefetch default)
RESULTS = ROOT / "benchmarks" / "results" / "driver_throughput.json"

SPEC = """
name = "driver"
task = "cost_model"
[static]
capacity = [4000000, 8000000, 16000000, 32000000]
[shapes.batch]
range = [1, 256]
values = [1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 256]
bucket = "ceil"
[shapes.kv_len]
range = [512, 65536]
values = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
step = 256
bucket = "ceil"
[configs]
per_batch_ms = [0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03]
per_kv_ms = [0.01, 0.02, 0.03, 0.05, 0.08, 0.1, 0.15]
[search]
strategy = "halving"
refine_budget = 16
probes = 2
"""


def build_work() -> Any:
    """The lane's work as ``tunectl submit`` builds it: search, refinement over it, probes over both."""
    from tunectl.core.plan import plan
    from tunectl.core.spec import parse_spec
    from tunectl.decide.inline_probes import probed
    from tunectl.decide.refine import refined
    from tunectl.decide.search import Search
    from tunectl.tasks.cost_model import CostModel

    spec, task = parse_spec(SPEC, "driver.toml"), CostModel()
    made = plan(spec, task)

    def check(static: Any, shape: Any) -> str | None:
        return task.check_point(dict(static), dict(shape))

    found = Search(made, spec.search, None)
    return probed(refined(found, made, check), found, made, check, None)


def length(item: Any) -> float:
    """An item's time on a worker, in virtual seconds, a little different per item."""
    base = 0.1 * item.rounds * len(item.arms) if item.arms else item.budget
    return base * (1.0 + (zlib.crc32(item.item_id.encode()) % 64) / 256)


@dataclass
class Worker:
    point: Any = None  # the point it is on
    calls: int = 0  # calls in flight
    free_at: float = 0.0  # when its device is done with what it has


class Busy:
    """The points other workers than ``me`` are on (what ``WorkQueue.pop`` keeps away from)."""

    def __init__(self, on: Counter[Any], me: Any) -> None:
        self.on, self.me = on, me

    def __contains__(self, point: Any) -> bool:
        return self.on[point] - (point == self.me) > 0


@dataclass
class Fleet:
    """A lane of fake workers, its queue and its work, played as the dispatcher plays them."""

    work: Any
    num_workers: int
    limit_s: float | None = None  # stop once the work's calls took this long (None: run to the end)
    spent: float = 0.0  # CPU seconds in the work's calls
    wall: float = 0.0  # seconds by the clock in them
    finished: int = 0  # items whose records came back
    phases: Counter[str] = field(default_factory=Counter)  # items handed out, by phase

    def __post_init__(self) -> None:
        from tunectl.orchestrator.workqueue import WorkQueue

        self.workers = [Worker() for _ in range(self.num_workers)]
        self.ahead = 16 * self.num_workers
        self.queue = WorkQueue(())
        self.drawn_all = False
        self.on: Counter[Any] = Counter()
        self.running: list[tuple[float, int, int, Any]] = []  # (finish, order, worker, item)
        self.now = 0.0
        self.order = itertools.count()  # ties in finish time go in hand-out order
        self.order_digest = hashlib.sha256()  # of every item handed out, in order: the decisions made
        self.last_word = time.monotonic()

    def timed(self, call: Any, *args: Any) -> Any:
        started, cpu = time.perf_counter(), time.process_time()
        out = call(*args)
        self.spent += time.process_time() - cpu
        self.wall += time.perf_counter() - started
        return out

    def push(self, items: list[Any]) -> None:
        for item in items:
            self.phases[str(item.phase)] += 1
            self.order_digest.update(item.item_id.encode())
            self.queue.push(item)

    def top_up(self) -> None:
        """``LaneFeed.top_up``: draw new points' items until the look-ahead is full."""
        if self.drawn_all or len(self.queue) >= self.ahead:
            return
        new = self.timed(self.work.draw, self.ahead - len(self.queue))
        self.drawn_all = not new
        self.push(new)

    def fill(self, index: int) -> None:
        """``_Dispatcher._fill``: calls for one worker until it has ``PREFETCH`` in flight."""
        worker = self.workers[index]
        while worker.calls < PREFETCH:
            self.top_up()
            item = self.queue.pop(worker.point, Busy(self.on, worker.point))
            if item is None:
                return
            self.on[worker.point] -= 1
            worker.point = item.point
            self.on[worker.point] += 1
            worker.free_at = max(self.now, worker.free_at) + length(item)
            worker.calls += 1
            heapq.heappush(self.running, (worker.free_at, next(self.order), index, item))

    def run(self, answer: Callable[[WorkItem], list[Record]]) -> dict[str, Any]:
        """Every item to the end (the work must then miss nothing), or until ``limit_s`` seconds of the
        work's calls are spent."""
        self.timed(self.work.start, [])
        self.push(self.timed(self.work.draw, self.ahead))
        self.timed(self.work.estimate)
        for i in range(self.num_workers):
            self.fill(i)
        while self.running and not (self.limit_s and self.spent > self.limit_s):
            self.now, _, index, item = heapq.heappop(self.running)
            self.workers[index].calls -= 1
            records = answer(item)
            self.finished += 1
            if time.monotonic() - self.last_word > 30:
                self.last_word = time.monotonic()
                print(f"  {self.finished} items in {self.spent:.0f} s", file=sys.stderr, flush=True)
            self.push(self.timed(self.work.follow_up, records))
            for i, worker in enumerate(self.workers):  # ``_fill_lane``
                if worker.calls < PREFETCH:
                    self.fill(i)
        if not self.running:
            self.timed(self.work.estimate)
            missing = self.timed(self.work.missing)
            if missing or len(self.queue):
                raise SystemExit(f"the work still misses {missing} item(s), {len(self.queue)} queued")
        return self.summary()

    def summary(self) -> dict[str, Any]:
        return {
            "workers": self.num_workers,
            "items": self.finished,
            "complete": not self.running,  # False: cut at limit_s
            "seconds": round(self.spent, 3),
            "items_per_s": round(self.finished / self.spent, 1),
            "wall_items_per_s": round(self.finished / self.wall, 1),
            "phases": dict(self.phases),
            "points": len(self.work.search.points),
            "order": self.order_digest.hexdigest()[:16],
        }


def measure(tree: Path, workers: int, limit_s: float | None) -> dict[str, Any]:
    """One fleet of ``workers`` over the work of the tunectl in ``tree`` (already first on the path)."""
    import tunectl
    from tests.unit.test_refine import answer

    if not Path(tunectl.__file__).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"tunectl came from {tunectl.__file__}, not {tree}")
    out = Fleet(build_work(), workers, limit_s).run(answer)
    return {"tree": str(tree), **out}


def compare(old: Path, workers: tuple[int, ...], limit_s: float | None) -> dict[str, Any]:
    """Each worker count in a fresh process of the old tree, then of this one; both figures."""
    per: dict[str, dict[str, Any]] = {}
    for n in workers:
        row = {}
        for name, tree in (("before", old), ("after", ROOT)):
            args = [sys.executable, __file__, "--tree", str(tree), "--workers", str(n)]
            args += ["--limit-s", str(limit_s)] if limit_s else []
            done = subprocess.run(args, check=True, capture_output=True, text=True)
            row[name] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{n:4d} workers  {name:6s} {row[name]['items_per_s']:>10,.0f} items/s", flush=True)
        per[str(n)] = row
    return {
        "before": min(r["before"]["items_per_s"] for r in per.values()),
        "after": min(r["after"]["items_per_s"] for r in per.values()),
        "limit_s": limit_s,
        "per_workers": per,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the source tree to import tunectl from")
    parser.add_argument("--compare", type=Path, help="an older tree: run it and this one side by side")
    parser.add_argument("--workers", type=int, nargs="+", default=list(WORKERS))
    parser.add_argument("--limit-s", type=float, help="stop a fleet once the work's calls took this long")
    args = parser.parse_args()
    if args.compare is not None:
        result = compare(args.compare, tuple(args.workers), args.limit_s)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
        print(f"before {result['before']:,.0f} items/s, after {result['after']:,.0f} items/s -> {RESULTS}")
        return
    sys.path[:0] = [str(args.tree), str(ROOT)]  # the tree's tunectl; the tests' record helper from here
    for n in args.workers:
        print(json.dumps(measure(args.tree, n, args.limit_s)), flush=True)


if __name__ == "__main__":
    main()
