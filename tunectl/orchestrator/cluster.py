"""Joining or starting a Ray cluster, and placing one worker per device on it.

GPUs are reserved through placement groups, one per accelerator type: one bundle of one GPU per
worker, packed. A GPU-less cluster gets one worker per node, owning the node's cores. A cluster
with several accelerator types gets one *pool* of workers per type; each pool measures the whole
plan, since what wins on one GPU model says little about another.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from tunectl.core.errors import UserError
from tunectl.orchestrator.notes import Note, drained
from tunectl.orchestrator.reach import check_ray, check_reachable, connect_timeout_s

__all__ = ["check_reachable", "connect", "connect_timeout_s"]

#: Pool names for devices of no declared accelerator type.
UNTYPED_GPU = "GPU"
CPU_POOL = "cpu"
_ACCEL_PREFIX = "accelerator_type:"
_AUTH_HINT = (
    "; if the cluster uses token authentication, set RAY_AUTH_MODE=token and give its token in "
    "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token (`ray get-auth-token` on the head prints it)"
)


@dataclass(frozen=True)
class Placement:
    """What was placed, in numbers."""

    kind: str  # "gpu" or "cpu"
    num_workers: int
    num_nodes: int
    pools: tuple[str, ...] = ()
    num_resident: int = 0  # of the workers, the cluster's resident ones (``tunectl.orchestrator.resident``)


@dataclass(frozen=True)
class WorkerSetup:
    """How every worker (and compile process) of a run starts: its environment (the compile caches),
    the tasks whose libraries it loads before its first item, and whether it compiles ahead itself."""

    env: tuple[tuple[str, str], ...] = ()
    warm_up: tuple[str, ...] = ()
    compile_ahead: bool = False
    #: the configs the run measures: a worker imports only their libraries before its first item
    uses: tuple[Any, ...] = ()
    #: the threads a CPU worker times with, where the spec sets them (``cpu_threads``)
    cpu_threads: int | None = None
    #: the driver's variables forwarded into ``env`` where it sets them (the others: unset)
    forwarded: tuple[str, ...] = ()

    def runtime_env(self, **extra: str) -> dict[str, Any]:
        return {"env_vars": {**dict(self.env), **extra}}


@dataclass
class Pool:
    """The workers on one kind of device (an accelerator type, or CPUs) and the group holding them.
    ``held_for``: the run that took this pool's resident workers (``tunectl.orchestrator.resident``):
    it gives them back when it ends, never stops them; ``settled``: per node, the compile keys whose build
    the node's compile cache settles for them (``resident.ask_settled``)."""

    name: str
    workers: list[Any] = field(default_factory=list)
    placement_group: Any = None
    node_ids: set[str] = field(default_factory=set)
    held_for: str | None = None
    settled: dict[str, set[str]] = field(default_factory=dict)


#: Resident workers (``tunectl.orchestrator.resident``) are named actors of this namespace, held by
#: placement groups named alike: ``tunectl-resident-<pool>`` and ``tunectl-resident-<pool>-<index>``.
NAMESPACE = "tunectl"
RESIDENT_PREFIX = "tunectl-resident"


def resident_name(pool: str, index: int | None = None) -> str:
    return f"{RESIDENT_PREFIX}-{pool}" + ("" if index is None else f"-{index}")


def _named(pool: str, index: int, resident: bool) -> dict[str, Any]:
    """A worker's actor options: a resident one is named, and outlives the driver that started it."""
    if not resident:
        return {}
    return {"name": resident_name(pool, index), "namespace": NAMESPACE, "lifetime": "detached"}


def connect(
    address: str | None,
    num_gpus: int | None = None,
    num_cpus: int | None = None,
    *,
    timeout_s: float | None = None,
) -> bool:
    """Join ``address`` (or ``RAY_ADDRESS``), else start a local instance. True if this call connected.

    Without an address this never joins some other Ray instance that happens to run on the machine.
    An address that is not a Ray cluster's, found out within ``timeout_s`` (default
    ``TUNECTL_CONNECT_TIMEOUT_S``, 10 s) and without Ray's warnings, is a ``UserError`` (Ray itself
    would retry for minutes; ``tunectl.orchestrator.reach``).
    """
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    joined = cluster_address(address)
    joining = bool(joined)
    kwargs: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": True}
    if joining:
        if num_gpus is not None or num_cpus is not None:
            raise UserError("--num-gpus applies to a local instance only, not when joining a cluster")
        if address:
            kwargs["address"] = address
        check_ray(joined, timeout_s or connect_timeout_s())
    else:
        counts = {"num_gpus": num_gpus, "num_cpus": num_cpus}
        kwargs.update(address="local", include_dashboard=False)
        kwargs.update({name: count for name, count in counts.items() if count is not None})
    try:
        _init_with_retries(kwargs)
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
        target = joined or "a local Ray instance"
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = " ".join(lines)[:300] or type(exc).__name__
        hint = _AUTH_HINT if joining and os.environ.get("RAY_AUTH_MODE", "").lower() != "token" else ""
        raise UserError(f"cannot connect to {target}: {detail}{hint}") from None
    if not joining:
        _watch_local_instance()
    return True


def cluster_address(address: str | None) -> str:
    """The cluster a driver joins: ``address``, else ``RAY_ADDRESS``; "" for none (a local instance)."""
    return address or os.environ.get("RAY_ADDRESS", "")


def _watch_local_instance() -> None:
    """Have the local instance's processes stopped when this driver dies, however it dies: after a
    SIGKILL Ray leaves its dashboard and runtime-env processes running for a minute
    (``tunectl.orchestrator.reaper``)."""
    from tunectl.orchestrator import reaper

    with contextlib.suppress(AttributeError, OSError):  # Ray keeps its processes elsewhere: none watched
        node: Any = ray._private.worker._global_node
        reaper.watch(info.process.pid for infos in node.all_processes.values() for info in infos)


def _init_with_retries(kwargs: dict[str, Any], attempts: int = 3, backoff_s: float = 2.0) -> None:
    """``ray.init``, retried where a Ray client server failed to start its session in time.

    A busy head starts a server process per client session; when that start outlasts Ray's own
    wait, the client sees "Initialization failure from server" although a second try succeeds.
    """
    for attempt in range(1, attempts + 1):
        try:
            ray.init(**kwargs)
            return
        except ConnectionError as exc:
            transient = str(kwargs.get("address", "")).startswith(
                "ray://"
            ) and "Initialization failure" in str(exc)
            if not transient or attempt == attempts:
                raise
            with contextlib.suppress(Exception):
                ray.shutdown()
            time.sleep(backoff_s * attempt)


def gpu_inventory() -> dict[str, tuple[int, int]]:
    """Accelerator type -> (number of GPUs, number of nodes), over the alive nodes."""
    inventory: dict[str, tuple[int, int]] = {}
    for node in ray.nodes():
        resources = node.get("Resources", {})
        gpus = int(resources.get("GPU", 0))
        if not node.get("Alive") or gpus < 1:
            continue
        types = sorted(r[len(_ACCEL_PREFIX) :] for r in resources if r.startswith(_ACCEL_PREFIX))
        name = types[0] if types else UNTYPED_GPU
        count, nodes = inventory.get(name, (0, 0))
        inventory[name] = (count + gpus, nodes + 1)
    return inventory


def choose_pools(accelerator_type: str | None, num_gpus: int | None) -> list[str]:
    """The pools a new run plans for: the spec's accelerator type, else every type the cluster has."""
    inventory = gpu_inventory()
    if accelerator_type is not None:
        if accelerator_type not in inventory:
            have = ", ".join(sorted(inventory)) or "none"
            raise UserError(f"no node offers accelerator type {accelerator_type!r}; the cluster has {have}")
        return [accelerator_type]
    if inventory:
        return sorted(inventory)
    if num_gpus:
        raise UserError(f"the spec asks for {num_gpus} GPU(s) but the cluster has none")
    return [CPU_POOL]


def start_pools(
    names: Sequence[str],
    num_gpus: int | None = None,
    setup: WorkerSetup = WorkerSetup(),
    timeout_s: float = 120.0,
    label: str = "tunectl",
    resident: bool = False,
) -> tuple[list[Pool], Placement]:
    """Start the workers of each named pool. ``num_gpus`` caps the workers of each pool. ``resident``:
    named workers (and groups) that outlive this driver (``tunectl.orchestrator.resident``)."""
    inventory = gpu_inventory()
    pools: list[Pool] = []
    try:
        for name in names:
            if name == CPU_POOL:
                pools.append(_cpu_pool(setup, resident))
                continue
            if name not in inventory:
                have = ", ".join(sorted(inventory)) or "none"
                raise UserError(f"the run is planned for {name} GPUs but the cluster has {have} now")
            count = inventory[name][0] if num_gpus is None else min(num_gpus, inventory[name][0])
            pools.append(_gpu_pool(name, count, setup, timeout_s, label, resident))
    except BaseException:
        stop_pools(pools)
        raise
    return pools, placement_of(pools)


def placement_of(pools: Sequence[Pool]) -> Placement:
    """Where ``pools`` are, in numbers (resident ones counted apart)."""
    names = tuple(p.name for p in pools)
    kind = "cpu" if names == (CPU_POOL,) else "gpu"
    nodes = set().union(*(p.node_ids for p in pools))
    resident = sum(len(p.workers) for p in pools if p.held_for)
    return Placement(kind, sum(len(p.workers) for p in pools), len(nodes), names, resident)


def _gpu_pool(
    name: str, count: int, setup: WorkerSetup, timeout_s: float, label: str, resident: bool = False
) -> Pool:
    """``count`` workers on ``name`` GPUs, in a group named after ``label`` and the pool (a resident
    pool's group has the pool's resident name, and outlives this driver too)."""
    from ray.util.placement_group import placement_group, placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from tunectl.orchestrator.worker import TuneWorker

    extra = {} if name == UNTYPED_GPU else {f"{_ACCEL_PREFIX}{name}": 0.001}
    group_name, lifetime = (resident_name(name), "detached") if resident else (f"{label}-{name}", None)
    pg = placement_group([{"GPU": 1, **extra}] * count, strategy="PACK", name=group_name, lifetime=lifetime)
    pool = Pool(name, placement_group=pg)
    if not pg.wait(timeout_seconds=timeout_s):
        stop_pools([pool])
        raise UserError(
            f"could not reserve {count} {name} GPU(s) within {timeout_s:.0f} s (other jobs may hold them); "
            "set [resources] num_gpus in the spec to use fewer"
        )
    for index in range(count):
        strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index)
        pool.workers.append(
            _actor(TuneWorker)
            .options(
                num_gpus=1,
                num_cpus=0,
                resources=extra,
                scheduling_strategy=strategy,
                runtime_env=setup.runtime_env(),
                **_named(name, index, resident),
            )
            .remote(1, setup.compile_ahead, setup.warm_up, setup.uses)
        )
    pool.node_ids = set(placement_group_table(pg).get("bundles_to_node_id", {}).values())
    return pool


def cpu_threads(cpus: int, asked: int | None = None) -> int:
    """The threads a CPU worker times with on a node of ``cpus`` cores: ``asked`` (the spec's
    ``[resources] cpu_threads``), else all but one. The worker holds the node's every core in Ray,
    but the driver and Ray's own processes still run there: a kernel with a thread on every core
    stalls each time one of them is descheduled (on two cores, rounds of the quickstart's finals read
    over 10 times their median; on one thread, none: benchmarks/results/cpu_threads.md)."""
    return asked if asked is not None else max(1, cpus - 1)


def _cpu_pool(setup: WorkerSetup, resident: bool = False) -> Pool:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from tunectl.orchestrator.worker import TuneWorker

    pool = Pool(CPU_POOL)
    for node in ray.nodes():
        cpus = int(node.get("Resources", {}).get("CPU", 0))
        if not node.get("Alive") or cpus < 1:
            continue
        strategy = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
        pool.workers.append(
            _actor(TuneWorker)
            .options(
                num_cpus=cpus,
                scheduling_strategy=strategy,
                runtime_env=setup.runtime_env(),
                **_named(CPU_POOL, len(pool.workers), resident),
            )
            .remote(cpu_threads(cpus, setup.cpu_threads), setup.compile_ahead, setup.warm_up, setup.uses)
        )
        pool.node_ids.add(node["NodeID"])
    if not pool.workers:
        raise UserError("the cluster has no node with a CPU or GPU to run a worker on")
    return pool


def start_builders(
    node_ids: Sequence[str], per_node: int | None, setup: WorkerSetup
) -> list[tuple[Any, str]]:
    """Compile processes on each node, as (actor, node id); ``per_node`` None: half the node's cores
    not matched to a GPU, at most 4 per GPU (each holds a CUDA context and a point's inputs), at
    least 1.

    They see the node's GPUs (Ray hides them from actors that reserve none): a compile for a GPU needs
    the device. They reserve no CPU in Ray's accounting, since the GPU workers reserve none either.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from tunectl.orchestrator.compile_process import Builder

    resources = {n["NodeID"]: n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")}
    builders = []
    for node in node_ids:
        have = resources.get(node, {})
        spare = int(have.get("CPU", 1)) - int(have.get("GPU", 0))
        count = (
            per_node if per_node is not None else max(1, min(4 * max(1, int(have.get("GPU", 0))), spare // 2))
        )
        # One compile process is one compiler: Inductor's own pool of compile subprocesses in each
        # would multiply the processes (and the memory) by the node's cores.
        env = setup.runtime_env(
            RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES="1", TORCHINDUCTOR_COMPILE_THREADS="1"
        )
        strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        for index in range(count):
            actor = (
                _actor(Builder)
                .options(num_cpus=0, scheduling_strategy=strategy, runtime_env=env)
                .remote(index)
            )
            builders.append((actor, node))
    return builders


def stop_builders(builders: Sequence[tuple[Any, str]]) -> list[Note]:
    """Kill every compile process for good; what they noted on the side (``tunectl.orchestrator.notes``)."""
    notes: list[Note] = []
    with contextlib.suppress(Exception):  # best effort: a process that does not answer keeps its notes
        notes = drained([actor for actor, _ in builders])
    for actor, _ in builders:
        with contextlib.suppress(Exception):  # already gone
            ray.kill(actor, no_restart=True)
    return notes


def _actor(cls: type) -> Any:
    """A ``@ray.remote`` class as what it is at run time (type checkers see the plain class)."""
    return cls


def stop_pools(pools: Sequence[Pool]) -> list[Note]:
    """Kill every worker for good and give the reserved GPUs back, except resident ones, which are
    given back to the cluster (``Pool.held_for``); what the workers noted on the side
    (``tunectl.orchestrator.notes``). Never raises."""
    from ray.util.placement_group import remove_placement_group

    notes: list[Note] = []
    with contextlib.suppress(Exception):  # best effort: let idle workers tidy up their journals
        from tunectl.orchestrator.resident import release

        notes = drained([w for pool in pools if not pool.held_for for w in pool.workers]) + release(pools)
    for pool in (p for p in pools if not p.held_for):
        for worker in pool.workers:
            with contextlib.suppress(Exception):  # already gone: nothing to stop
                ray.kill(worker, no_restart=True)
        if pool.placement_group is not None:
            with contextlib.suppress(Exception):  # already removed, or the cluster is gone
                remove_placement_group(pool.placement_group)
    return notes
