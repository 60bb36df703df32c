"""A node removed mid-run, on a multi-node cluster on one machine: its work moves to the other nodes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import local_cluster
from tests.integration.test_faults import assert_one_row_per_item, planned_ids, write_spec
from tunectl.orchestrator.submit import submit
from tunectl.store.runs import run_log_path

pytestmark = pytest.mark.slow


@pytest.fixture
def two_gpu_nodes() -> Iterator[Any]:
    with local_cluster({"num_cpus": 1, "num_gpus": 1}, {"num_cpus": 1, "num_gpus": 1}) as cluster:
        yield cluster


class RemoveANodeAfter:
    """Progress that removes the node of the worker that sent the ``after``-th record."""

    def __init__(self, cluster: Any, results: Path, after: int) -> None:
        self.cluster, self.results, self.after = cluster, results, after
        self.seen, self.run_id, self.removed_pid = 0, "", ""

    def start(self, run_id: str, total: int, placement: Any) -> None:
        self.run_id = run_id

    def record(self, record: Any) -> None:
        self.seen += 1
        if self.seen != self.after:
            return
        pid = record.worker.rsplit(":", 1)[1]
        events = run_log_path(self.results, self.run_id).read_text()
        node_prefix = dict(re.findall(r"ready: pid (\d+) on \S+ \(node (\w+)", events))[pid]
        node = next(n for n in self.cluster.worker_nodes if n.node_id.startswith(node_prefix))
        self.cluster.remove_node(node, allow_graceful=False)
        self.removed_pid = pid


def test_a_node_removed_mid_run_moves_its_work_to_the_other_node(two_gpu_nodes: Any, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        '[[configs]]\nfault = "none"\nrun_ms = 100\nvariant = ' + str(list(range(1, 41))) + "\n",
        n=(4, 8),
    )
    # Work enough that the node's worker still holds calls when it goes (a call carries a batch of up
    # to 16 looks, so the first records come back 16 at a time).
    progress = RemoveANodeAfter(two_gpu_nodes, tmp_path / "results", after=4)
    out = submit(str(spec), tmp_path / "results", progress=progress)

    rows = assert_one_row_per_item(tmp_path / "results", out.run_id, planned_ids(spec))
    assert {r.status for r in rows} == {"ok"}, "losing a node is nobody's crash"
    events = run_log_path(tmp_path / "results", out.run_id).read_text()
    assert re.search(r"worker GPU#\d (lost with its node|died without a word).* go back to the queue", events)
    last = sorted(rows, key=lambda r: r.finished_at)[-5:]
    assert progress.removed_pid not in {r.worker.rsplit(":", 1)[1] for r in last}, "the rest ran elsewhere"
