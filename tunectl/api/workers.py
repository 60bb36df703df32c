"""Resident workers: one per GPU of a cluster, started once and kept between runs
(``tunectl.orchestrator.resident``). A run that joins the cluster measures on them at once."""

from __future__ import annotations

from typing import Any

from tunectl.api.options import Cluster
from tunectl.core.errors import UserError
from tunectl.core.spec import Spec
from tunectl.orchestrator.control import CompileOptions

Statuses = dict[str, list[dict[str, Any]]]


def workers_up(
    spec: Spec, cluster: Cluster, compile: CompileOptions | None = None, compile_ahead: bool | None = None
) -> Statuses:
    """Start a resident worker on each GPU ``spec``'s runs would use (its accelerator type, at most
    its ``num_gpus``), loading the libraries of its configs, as a run of ``spec`` with these options
    would start its own; once each has started, each one's status, by pool."""
    from tunectl.core.plan import plan
    from tunectl.core.registry import get_task
    from tunectl.orchestrator import resident
    from tunectl.orchestrator.cluster import choose_pools
    from tunectl.orchestrator.compiling import worker_setup

    work = plan(spec, get_task(spec.task))
    options = compile or CompileOptions()
    setup = worker_setup(
        options, spec.task, bool(compile_ahead), work.all_configs, spec.resources.cpu_threads
    )
    _join(cluster)
    names = choose_pools(spec.resources.accelerator_type, spec.resources.num_gpus)
    return resident.up(names, spec.resources.num_gpus, setup)


def workers_list(cluster: Cluster) -> Statuses:
    """The cluster's resident workers, by pool: where each runs, its start-up, the runs it has served
    and the run that holds it now (``run``), if any."""
    from tunectl.orchestrator import resident

    _join(cluster)
    return resident.statuses()


def workers_down(cluster: Cluster, force: bool = False) -> int:
    """Stop the cluster's resident workers and give their GPUs back: how many there were. Refused
    (``UserError``, nothing stopped) while a run measures on them, unless ``force``."""
    from tunectl.orchestrator import resident

    _join(cluster)
    return resident.down(force)


def _join(cluster: Cluster) -> None:
    from tunectl.orchestrator.cluster import cluster_address, connect

    if not cluster_address(cluster.address):
        raise UserError(
            "resident workers need a cluster that outlives this command: start one (`ray start --head`) "
            "and give its --address (auto: the one on this machine)"
        )
    connect(cluster.address)
