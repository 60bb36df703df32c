"""Shared fixtures of every tier. ``ray_two_gpus`` is one real local Ray instance per session (per
xdist worker), shared by the tests that ask for it; ``local_cluster`` starts a multi-node cluster of
its own for a block."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Ray prints a usage-stats banner and a dashboard warning otherwise.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# The cost model's calls report their cost rather than sleep it, here and in every Ray worker and
# driver started from here: decisions made from its times are the same on a busy machine.
os.environ.setdefault("TUNECTL_SIMULATED_COSTS", "1")


@pytest.fixture(scope="session")
def _shared_ray() -> Iterator[dict[str, str]]:
    """The session's local Ray instance, once started: its GCS address under "address"."""
    started: dict[str, str] = {}
    yield started
    if started:
        import ray

        ray.shutdown()


@pytest.fixture
def ray_two_gpus(_shared_ray: dict[str, str]) -> None:
    """A local Ray instance with 2 logical GPUs and 2 CPUs (the GPUs are for scheduling only).

    Started once per session and shared: a run stops its workers and placement groups when it ends,
    so the next test finds the instance as new. Started again after a test connected elsewhere (a
    ``local_cluster`` block shuts Ray down when it ends)."""
    import ray

    if ray.is_initialized() and ray.get_runtime_context().gcs_address == _shared_ray.get("address"):
        return
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, logging_level="ERROR")
    _shared_ray["address"] = ray.get_runtime_context().gcs_address


@contextmanager
def local_cluster(*nodes: dict[str, Any]) -> Iterator[Any]:
    """A multi-node Ray cluster on this machine: a head with one CPU and no GPU, then ``nodes`` (each
    ``Cluster.add_node``'s arguments); Ray is connected to it until the block ends."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    for node in nodes:
        cluster.add_node(**node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR")
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def quickstart_spec_text() -> str:
    return (ROOT / "configs" / "quickstart.toml").read_text()


#: the static key of the small decode_attention specs the tests run (one point of the static grid)
TINY_STATIC = """[static]
dtype = "float32"
num_q_heads = 4
num_kv_heads = 2
head_dim = 16
page_size = 8
"""
TINY_SPEC = f"""
name = "tiny"
task = "decode_attention"
{TINY_STATIC}[shapes.batch]
values = [1, 2, 4]
bucket = "pow2"
[shapes.kv_len]
values = [64, 128]
bucket = "ceil"
[configs]
num_splits = [1, 2]
gqa = ["expand", "grouped"]
[measure]
warmup = 1
min_samples = 3
max_samples = 20
max_seconds = 0.05
[search]
rounds = 3
"""


@pytest.fixture
def tiny_spec(tmp_path: Path) -> Path:
    """A spec small enough to run in a second: 6 shapes x 4 configs."""
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_SPEC)
    return path
