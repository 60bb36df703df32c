"""CPU workers on a multi-node cluster on one machine: each times with its node's cores but one (the
driver and Ray's own processes run beside it), or with the threads the spec's ``[resources]
cpu_threads`` gives. Nodes: the head (1 CPU) and a node of 3 CPUs, no GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import local_cluster
from tests.integration.test_faults import assert_one_row_per_item, planned_ids, write_spec
from tunectl.orchestrator.submit import submit

pytestmark = pytest.mark.slow

FAST = '[[configs]]\nfault = "none"\nrun_ms = 1\nvariant = [1, 2, 3, 4, 5]\n'


def test_cpu_workers_time_with_all_cores_but_one_or_what_the_spec_says(tmp_path: Path) -> None:
    with local_cluster({"num_cpus": 3, "num_gpus": 0}):
        threads = {}
        for name, resources in (("default", None), ("asked", "cpu_threads = 1")):
            extra = {"resources": resources} if resources else {}
            spec = write_spec(tmp_path, FAST, n=(4, 8, 16), **extra)
            out = submit(str(spec), tmp_path / name)
            rows = assert_one_row_per_item(tmp_path / name, out.run_id, planned_ids(spec))
            threads[name] = {json.loads(r.env_json)["num_threads"] for r in rows}
    assert threads["default"] <= {1, 2} and 2 in threads["default"], threads  # 3 cores: 2; the head's 1: 1
    assert threads["asked"] == {1}, threads
