"""Placement on a multi-node cluster on one machine: one worker per GPU, per accelerator type.

Nodes: a GPU-less head; two nodes with A100s (2 + 1 logical GPUs); one node with an H100.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import local_cluster
from tests.integration.test_faults import assert_one_row_per_item, planned_ids, write_spec
from tunectl.core.errors import UserError
from tunectl.core.record import Record
from tunectl.orchestrator.submit import submit
from tunectl.store.runs import load_run, run_log_path

pytestmark = pytest.mark.slow

FAST = '[[configs]]\nfault = "none"\nrun_ms = 1\nvariant = [1, 2, 3, 4, 5]\n'


@pytest.fixture(scope="module")
def mixed_cluster() -> Iterator[object]:
    with local_cluster(
        {"num_cpus": 1, "num_gpus": 2, "resources": {"accelerator_type:A100": 1}},
        {"num_cpus": 1, "num_gpus": 1, "resources": {"accelerator_type:A100": 1}},
        {"num_cpus": 1, "num_gpus": 1, "resources": {"accelerator_type:H100": 1}},
    ) as cluster:
        yield cluster


def pool_of_worker(results: Path, run_id: str) -> dict[str, str]:
    """pid -> pool, from the run's event log."""
    events = run_log_path(results, run_id).read_text()
    return {pid: pool for pool, pid in re.findall(r"worker (\S+)#\d+ ready: pid (\d+)", events)}


def pools_that_measured(rows: list[Record], pools: dict[str, str]) -> Counter[str]:
    return Counter(pools[str(r.worker).rsplit(":", 1)[1]] for r in rows)


def test_a_spec_for_one_accelerator_type_gets_one_worker_per_such_gpu_on_every_node(
    mixed_cluster: object, tmp_path: Path
) -> None:
    import ray

    spec = write_spec(tmp_path, FAST, n=(4, 8, 16), resources='accelerator_type = "A100"')
    seen: list[object] = []

    class Watch:
        def start(self, run_id: str, total: int, placement: object) -> None:
            seen.append(placement)

        def record(self, record: object) -> None:
            pass

    out = submit(str(spec), tmp_path / "results", progress=Watch())

    placement = seen[0]
    assert (placement.kind, placement.num_workers, placement.num_nodes) == ("gpu", 3, 2)  # type: ignore[attr-defined]
    rows = assert_one_row_per_item(tmp_path / "results", out.run_id, planned_ids(spec))
    assert set(pools_that_measured(rows, pool_of_worker(tmp_path / "results", out.run_id))) == {"A100"}
    deadline = time.monotonic() + 10
    while ray.available_resources().get("GPU") != 4 and time.monotonic() < deadline:
        time.sleep(0.1)  # actors and placement groups are released asynchronously
    assert ray.available_resources().get("GPU") == 4, "the run gave its GPUs back"


def test_a_heterogeneous_cluster_measures_the_whole_plan_once_per_accelerator_type(
    mixed_cluster: object, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, FAST, n=(4, 8))
    out = submit(str(spec), tmp_path / "results")

    info = load_run(tmp_path / "results", out.run_id)
    assert info.pools == ("A100", "H100")
    assert info.num_planned == 2 * len(planned_ids(spec)) == out.statuses["ok"]
    from tunectl.core.plan import in_pool, plan
    from tunectl.core.spec import load_spec

    items = list(plan(load_spec(spec)).work_items())
    by_pool = {p: [dataclasses.replace(i, item_id=in_pool(i.item_id, p)) for i in items] for p in info.pools}
    expected = [i.item_id for items in by_pool.values() for i in items]
    rows = assert_one_row_per_item(tmp_path / "results", out.run_id, expected)
    pools = pool_of_worker(tmp_path / "results", out.run_id)
    for pool, items in by_pool.items():
        ids = {i.item_id for i in items}
        mine = [r for r in rows if r.item_id in ids]
        assert set(pools_that_measured(mine, pools)) == {pool}, f"{pool} items ran on {pool} GPUs only"
    per_point = Counter((r.static_key, r.shape_key, r.config_key) for r in rows)
    assert set(per_point.values()) == {2}, "every planned point and config measured on both types"


def test_num_gpus_caps_the_workers(mixed_cluster: object, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, FAST, resources='accelerator_type = "A100"\nnum_gpus = 1')
    out = submit(str(spec), tmp_path / "results")
    assert out.placement is not None and out.placement.num_workers == 1


def test_an_accelerator_type_the_cluster_lacks_is_refused_with_the_types_it_has(
    mixed_cluster: object, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, FAST, resources='accelerator_type = "B200"')
    with pytest.raises(UserError, match="no node offers accelerator type 'B200'; the cluster has A100, H100"):
        submit(str(spec), tmp_path / "results")
