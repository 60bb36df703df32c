"""A run's compile processes: where they start, the scheduler that keeps them busy, and what the run's
metadata says of them (``tunectl.orchestrator.compile_schedule`` is the bookkeeping they serve)."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tunectl.orchestrator import resident
from tunectl.orchestrator.cluster import CPU_POOL, Pool, WorkerSetup, start_builders
from tunectl.orchestrator.compile_schedule import SHARED, BuildBook, BuildScheduler, KeyFn, key_function
from tunectl.orchestrator.control import CompileOptions
from tunectl.orchestrator.feed import Lane
from tunectl.store.runs import RunInfo, results_option

log = logging.getLogger("tunectl.run")

OnCompiles = Callable[[int, int, int], None]  # (built, total, building), told as the counts change


def worker_setup(
    compile: CompileOptions,
    task: str,
    compile_ahead: bool,
    uses: Sequence[Any] = (),
    cpu_threads: int | None = None,
) -> WorkerSetup:
    """How the run's workers and compile processes start: the compile caches, the driver's profile
    folder and allocator settings where set (on a joined cluster too, whose processes do not inherit
    the driver's environment), the task warmed up for the configs it ``uses`` (none
    given: all its libraries), a CPU worker's threads."""
    from tunectl.orchestrator.worker import PROFILE_ENV
    from tunectl.tasks.compile import cache_env
    from tunectl.tasks.env import ALLOC_CONF_ENV

    names = (PROFILE_ENV, ALLOC_CONF_ENV)
    forwarded = {name: os.environ[name] for name in names if os.environ.get(name)}
    env = tuple(sorted({**cache_env(compile.cache_root()), **forwarded}.items()))
    return WorkerSetup(
        env=env,
        warm_up=(task,),
        compile_ahead=compile_ahead,
        uses=tuple(uses),
        cpu_threads=cpu_threads,
        forwarded=names,
    )


def start_builds(
    lanes: Sequence[Lane],
    pools: Sequence[Pool],
    *,
    info: RunInfo,
    options: CompileOptions,
    setup: WorkerSetup,
    on_compiles: OnCompiles,
) -> tuple[RunInfo, list[tuple[Any, str]], BuildScheduler | None]:
    """Compile processes, as (actor, node id), where the lanes' first items have kernels to build
    ahead (the caller stops them), none where the resident workers' caches settle every one of them
    on every node (``settled_before``: a kernel a later item needs is then built by its worker, as
    without compile processes); the run's metadata saying so, and the scheduler that hands them
    builds (None without any)."""
    key_fn = key_function()
    wanted = {key for lane in lanes for item in lane.items for key in key_fn(item)}
    resident.ask_settled(pools)
    known = settled_before(pools)
    nodes = [known.get(n, set()) for n in set().union(*(p.node_ids for p in pools))]
    everywhere = known[SHARED] if options.shared else set.intersection(*nodes) if nodes else set()
    builders = _builders(pools, options, setup) if wanted - everywhere else []
    info = dataclasses.replace(info, compile=_compile_meta(options, setup, builders))
    return info, builders, _scheduler(options, builders, on_compiles, key_fn, known)


def note_builds(info: RunInfo, builds: BuildScheduler, results: Path) -> None:
    """What the compile processes built, in the run's metadata and its log (each failure in the log
    alone; the console has their count by status). A kernel settled before the run (``settled_before``)
    is counted apart, as ``kept``."""
    book = builds.book
    kept = sum(key in book.known.get(scope, ()) for scope, keys in book.keys.items() for key in keys)
    built, total, _ = book.counts()
    built -= kept
    info.compile.update(
        built=built,
        kept=kept,
        keys=total,
        build_seconds=round(builds.book.seconds, 3),
        per_kernel_seconds=builds.book.build_seconds,
    )
    failed = builds.book.failures()
    not_built = ", ".join(f"{n} {status}" for status, n in sorted(failed.items()))
    log.info(
        "run %s: compile processes built %d of %d kernel(s) in %.1f s of compile time%s%s",
        info.run_id,
        built,
        total,
        builds.book.seconds,
        f" ({kept} settled in earlier runs)" if kept else "",
        f" (not built: {not_built}; `tunectl logs {info.run_id}{results_option(results)}` says why)"
        if failed
        else "",
    )


def _builders(pools: Sequence[Pool], compile: CompileOptions, setup: WorkerSetup) -> list[tuple[Any, str]]:
    """Compile processes on the nodes of the run's pools: on GPU nodes unless told otherwise; on
    GPU-less nodes only when asked for (they would take cores from the measurement)."""
    if compile.workers_per_node == 0:
        return []
    if compile.workers_per_node is None and all(p.name == CPU_POOL for p in pools):
        return []
    nodes = sorted(set().union(*(p.node_ids for p in pools)))
    return start_builders(nodes, compile.workers_per_node, setup)


def settled_before(pools: Sequence[Pool]) -> dict[str, set[str]]:
    """Per node, and for a shared cache (``SHARED``) on any, the kernels whose build resident workers
    found settled by their node's compile cache (``Pool.settled``)."""
    out: dict[str, set[str]] = {SHARED: set()}
    for pool in pools:
        for node, keys in pool.settled.items():
            out.setdefault(node, set()).update(keys)
            out[SHARED].update(keys)
    return out


def _scheduler(
    compile: CompileOptions,
    builders: list[tuple[Any, str]],
    on_compiles: OnCompiles,
    key_fn: KeyFn,
    known: dict[str, set[str]],
) -> BuildScheduler | None:
    if not builders:
        return None
    scopes = [SHARED] if compile.shared else sorted({node for _, node in builders})
    book = BuildBook(key_fn, scopes, known)
    return BuildScheduler(book, builders, compile.timeout_s, on_change=lambda b: on_compiles(*b.counts()))


def _compile_meta(
    compile: CompileOptions, setup: WorkerSetup, builders: list[tuple[Any, str]]
) -> dict[str, Any]:
    return {
        "cache": compile.cache_root(),
        "shared": compile.shared,
        "timeout_s": compile.timeout_s,
        "compile_processes": len(builders),
        "env": dict(setup.env),
    }
