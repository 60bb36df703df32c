"""Joining: a running Ray cluster passes the check made before ``ray.init`` is asked to join it."""

from __future__ import annotations

import time

import pytest

from tunectl.orchestrator.reach import check_ray


@pytest.mark.usefixtures("ray_two_gpus")
def test_a_ray_cluster_answers_the_check_at_once() -> None:
    import ray

    address = ray.get_runtime_context().gcs_address
    started = time.monotonic()
    check_ray(address, timeout_s=5)  # raises if this GCS were taken for something else
    assert time.monotonic() - started < 2
