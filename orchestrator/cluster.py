"""Joining or starting a Ray cluster, and placing one worker per device on it."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tunectl.errors import UserError


@dataclass(frozen=True)
class Placement:
    """What was placed: one entry per worker (its node and the resources it holds)."""

    kind: str  # "gpu" or "cpu"
    num_workers: int
    num_nodes: int


def connect(address: str | None, num_gpus: int | None = None, num_cpus: int | None = None) -> bool:
    """Join ``address`` or start a local instance. Returns True if this call started/joined Ray."""
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    kwargs: dict[str, Any] = {
        "logging_level": logging.ERROR,
        "log_to_driver": True,
        "include_dashboard": False,
    }
    # Workers import tunectl, tasks and orchestrator from the driver's interpreter environment.
    if address:
        kwargs.pop("include_dashboard")
        kwargs["address"] = address
    else:
        if num_gpus is not None:
            kwargs["num_gpus"] = num_gpus
        if num_cpus is not None:
            kwargs["num_cpus"] = num_cpus
    try:
        ray.init(**kwargs)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        target = address or "a local Ray instance"
        raise UserError(f"cannot connect to {target}: {str(exc).splitlines()[0]}") from None
    return True


def start_workers(
    num_gpus: int | None = None, accelerator_type: str | None = None
) -> tuple[list[Any], Placement]:
    """One worker per GPU (``num_gpus=1`` each) where the cluster has GPUs, else one per node."""
    from orchestrator.worker import TuneWorker

    total_gpus = int(ray.cluster_resources().get("GPU", 0))
    alive = [n for n in ray.nodes() if n.get("Alive")]
    if accelerator_type is not None:
        resource = f"accelerator_type:{accelerator_type}"
        if not any(resource in n.get("Resources", {}) for n in alive):
            types = sorted(
                {
                    r.split(":", 1)[1]
                    for n in alive
                    for r in n.get("Resources", {})
                    if r.startswith("accelerator_type:")
                }
            )
            raise UserError(
                f"no node offers accelerator type {accelerator_type!r}; the cluster has "
                f"{', '.join(types) or 'none'}"
            )
    if total_gpus:
        count = total_gpus if num_gpus is None else min(num_gpus, total_gpus)
        opts: dict[str, Any] = {"num_gpus": 1, "num_cpus": 0}
        if accelerator_type is not None:
            opts["resources"] = {f"accelerator_type:{accelerator_type}": 0.001}
        workers = [TuneWorker.options(**opts).remote(1) for _ in range(count)]  # type: ignore[attr-defined]
        nodes = {n["NodeID"] for n in alive if n.get("Resources", {}).get("GPU")}
        return workers, Placement("gpu", count, len(nodes))
    if num_gpus:
        raise UserError(f"the spec asks for {num_gpus} GPU(s) but the cluster has none")
    workers = []
    for node in alive:
        cpus = int(node.get("Resources", {}).get("CPU", 0))
        if cpus < 1:
            continue
        strategy = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
        workers.append(TuneWorker.options(num_cpus=cpus, scheduling_strategy=strategy).remote(cpus))  # type: ignore[attr-defined]
    if not workers:
        raise UserError("the cluster has no node with a CPU or GPU to run a worker on")
    return workers, Placement("cpu", len(workers), len(workers))
