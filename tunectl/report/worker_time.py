"""Where each worker's time went in a run, read from its rows: did the device measure, or wait?

A worker's *span* runs from its first row's start to its last row's finish. Its rows say where the
time inside went (``tunectl.core.record``): loading kernels (``compile_ms``: preparing a kernel and its
first, checked call), building a point's inputs (``setup_ms``), measuring (``measure_ms``, of which the
drift guard's ``guard_ms``). The rows of one call (a batch of looks, a comparison's arms) share its
start, so the call lasts until its last row's finish, and the span outside every call is the worker
*waiting* for the driver's next item: on a cold compile cache, mostly for kernels still being built.
What is left inside the calls (*other*) is the engine's own: samplers' builds, output checks, records,
and waits for device memory that other processes hold (the run's console sums those in a line of its
own, ``tunectl.orchestrator.notes``).

The *kernel* seconds are the measured kernels' own: each ok row's samples (``num_samples`` of
``calls_per_sample`` calls each, and ``warmup`` more where the caller knows its engine took them)
and its checked first call, at the row's mean. A comparison's rows share one set-up and one
measurement, counted once. Kernel over span is the share of the span the device ran the kernels
being tuned (*busy*): the rest is the measuring method's own work (cache flushes, the guard's
reference), the host, and waiting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tunectl.core.record import Record, Status


@dataclass(frozen=True)
class WorkerTime:
    """One worker's span and its parts, in seconds (module doc)."""

    worker: str
    span_s: float
    kernel_s: float
    measuring_s: float
    guard_s: float
    loading_s: float
    setup_s: float
    waiting_s: float

    @property
    def busy(self) -> float:
        return self.kernel_s / self.span_s if self.span_s > 0 else 0.0

    @property
    def other_s(self) -> float:
        """Inside the worker's calls, besides loading, set-up and measuring."""
        return max(0.0, self.span_s - self.loading_s - self.setup_s - self.measuring_s - self.waiting_s)

    @classmethod
    def summed(cls, times: Iterable[WorkerTime], name: str) -> WorkerTime:
        """``times`` added up, under ``name`` (busy: their kernels over their spans together)."""
        times = list(times)
        parts = [f.name for f in dataclasses.fields(cls) if f.name != "worker"]
        return cls(name, *(sum(getattr(t, p) for t in times) for p in parts))

    def line(self, startup: Mapping[str, Any] | None = None) -> str:
        """One console line: the worker's start-up where ``startup`` says it (``TuneWorker.startup``),
        the span, how busy the kernels kept the device, and the parts."""
        guard = f" (drift guard {self.guard_s:.1f} s)" if self.guard_s else ""
        began = ""
        if startup and "total_s" in startup:
            libraries = sum(startup.get("libraries", {}).values())
            imports = f" (kernel libraries {libraries:.1f} s)" if libraries >= 0.05 else ""
            threads = startup.get("threads")
            on = f" on {threads} thread{'s' if threads != 1 else ''}" if threads else ""
            began = f"started in {startup['total_s']:.1f} s{imports}{on}, then "
            if startup.get("resident"):  # started before this run, by ``tunectl workers up``
                began = f"resident (started in {startup['total_s']:.1f} s before its first run{on}), "
        return (
            f"{self.worker}: {began}{self.span_s:.1f} s from first item to last, the tuned kernels running "
            f"{100 * self.busy:.0f} % of it; "
            f"measuring {self.measuring_s:.1f} s{guard}, loading kernels {self.loading_s:.1f} s, "
            f"point set-up {self.setup_s:.1f} s, waiting for work {self.waiting_s:.1f} s, "
            f"other {self.other_s:.1f} s"
        )


def worker_times(records: Iterable[Record], since: float = 0.0, warmup: int = 0) -> list[WorkerTime]:
    """Each worker's time over the rows it measured that started at or after ``since`` (epoch
    seconds: one submit of a resumed run), in the order the workers first appear."""
    mine: dict[str, list[Record]] = {}
    for r in records:
        # a row without a worker was recorded by the driver; one without a start, by an old version
        if r.worker and r.started_at > 0 and r.started_at >= since:
            mine.setdefault(r.worker, []).append(r)
    return [_worker_time(name, rows, warmup) for name, rows in mine.items()]


def _worker_time(worker: str, rows: list[Record], warmup: int) -> WorkerTime:
    calls: dict[float, float] = {}
    for r in rows:
        calls[r.started_at] = max(calls.get(r.started_at, r.finished_at), r.finished_at)
    span = max(calls.values()) - min(calls)
    once = list({r.group_id or f"item {i}": r for i, r in enumerate(rows)}.values())
    return WorkerTime(
        worker=worker,
        span_s=span,
        kernel_s=sum(kernel_seconds(r, warmup) for r in rows if r.status is Status.OK),
        measuring_s=sum(r.measure_ms or 0.0 for r in once) / 1e3,
        guard_s=sum(r.guard_ms or 0.0 for r in once) / 1e3,
        loading_s=sum(r.compile_ms or 0.0 for r in rows) / 1e3,
        setup_s=sum(r.setup_ms or 0.0 for r in once) / 1e3,
        waiting_s=max(0.0, span - sum(end - start for start, end in calls.items())),
    )


def kernel_seconds(row: Record, warmup: int = 0) -> float:
    """The measured kernel's own time in ``row``: its samples' calls, ``warmup`` samples more, and its
    checked first call, at the row's mean (module doc)."""
    calls = ((row.num_samples or 0) + warmup) * (row.calls_per_sample or 1) + 1
    return calls * (row.mean_us or 0.0) / 1e6
