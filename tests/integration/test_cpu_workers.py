"""A CPU worker times with its node's cores but one (the driver and Ray's own processes run beside
it), or with the threads the spec's ``[resources] cpu_threads`` gives. A local Ray instance of 3 CPUs
and no GPU: one worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_faults import assert_one_row_per_item, planned_ids, write_spec
from tunectl.orchestrator.submit import submit

pytestmark = pytest.mark.slow

FAST = '[[configs]]\nfault = "none"\nrun_ms = 1\nvariant = [1, 2, 3, 4, 5]\n'


def test_a_cpu_worker_times_with_all_cores_but_one_or_what_the_spec_says(tmp_path: Path) -> None:
    import ray

    if ray.is_initialized():  # the session's shared instance starts again for the next test that asks
        ray.shutdown()
    ray.init(address="local", num_cpus=3, num_gpus=0, include_dashboard=False, logging_level="ERROR")
    threads = {}
    try:
        for name, resources in (("default", None), ("asked", "cpu_threads = 1")):
            extra = {"resources": resources} if resources else {}
            spec = write_spec(tmp_path, FAST, n=(4, 8, 16), **extra)
            out = submit(str(spec), tmp_path / name)
            rows = assert_one_row_per_item(tmp_path / name, out.run_id, planned_ids(spec))
            threads[name] = {json.loads(r.env_json)["num_threads"] for r in rows}
    finally:
        ray.shutdown()
    assert threads == {"default": {2}, "asked": {1}}, threads
